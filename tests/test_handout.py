"""The C exercises' files: handed out next to the notebooks, judged against the skeleton as shipped.

A learner edits ``exercises/clip.c`` in place, as notebook 09 says: the checkers must judge that file
as what it now is (they once compared it with itself and called every edit "not attempted").
"""

from __future__ import annotations

import json

import pytest

from lab_backends import cli
from lab_backends.errors import ExerciseError
from lab_backends.lessons import c_lab, handout, native_exercise
from lab_backends.lessons.exercises import batch_strategy
from lab_backends.lessons.exercises.answers import shipped
from lab_backends.server.cbackend import INCLUDE_DIR


def test_set_up_hands_out_each_skeleton_and_the_headers_once(tmp_path) -> None:
    written = handout.hand_out(tmp_path)
    for item in handout.HANDOUTS:
        copy = item.in_notebooks(tmp_path)
        assert copy in written and copy.read_text() == item.shipped.read_text()
    for header in INCLUDE_DIR.glob("*.h"):
        assert (tmp_path / "exercises" / "include" / header.name).read_bytes() == header.read_bytes()
    mine = handout.handout("clip_backend").in_notebooks(tmp_path)
    mine.write_text("/* my work */\n")
    assert handout.hand_out(tmp_path) == [] and mine.read_text() == "/* my work */\n"  # never overwritten


def test_an_untouched_copy_of_an_older_skeleton_is_not_an_attempt_and_set_up_replaces_it(tmp_path) -> None:
    """A learner who pulled a project whose skeleton changed still has the old one, untouched: its check says
    "not attempted" (not a build error in code they never wrote), and set-up hands the new one out. An edited
    copy of the old one stays theirs."""
    item = native_exercise.HANDOUT
    handout.hand_out(tmp_path)
    folder = tmp_path / "exercises"
    old = item.shipped.read_text().replace("TODO(exercise)", "TODO(exercise, as handed out last month)")
    for name in (item.filename, handout.handout("clip_backend").filename):  # as an older set-up left them
        (folder / name).write_text(old)
    record = handout.handed_out(folder)
    record.update({item.filename: handout.words_digest(old),
                   handout.handout("clip_backend").filename: handout.words_digest("/* something else */")})
    (folder / handout.RECORD).write_text(json.dumps(record))
    copy = item.in_notebooks(tmp_path)
    with pytest.raises(NotImplementedError, match="next to this notebook"):
        native_exercise.read_answer(copy)
    assert handout.hand_out(tmp_path) == [copy]
    assert copy.read_text() == item.shipped.read_text()
    assert handout.handout("clip_backend").in_notebooks(tmp_path).read_text() == old  # not the old record's: theirs
    assert handout.handed_out(folder)[item.filename] == handout.words_digest(item.shipped.read_text())
    assert handout.hand_out(tmp_path) == []


def test_reset_keeps_the_learners_file(tmp_path, capsys, monkeypatch) -> None:
    handout.hand_out(tmp_path)
    mine = handout.handout("one_tenant_per_batch").in_notebooks(tmp_path)
    mine.write_text("/* half done */\n")
    fresh, kept = handout.reset("one_tenant_per_batch", tmp_path)
    assert fresh == mine and fresh.read_text() == handout.handout("one_tenant_per_batch").shipped.read_text()
    assert kept is not None and kept.read_text() == "/* half done */\n" and kept.name.endswith(".bak")
    assert cli.main(["exercises", "reset"]) == 2 and "name the exercise" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["home", "notebooks"])
def test_reset_in_a_class_learners_terminal_resets_their_own_copy(tmp_path, capsys, monkeypatch, where) -> None:
    """A class learner's terminal opens in their home (or they cd into ~/notebooks); the project's copy is not
    theirs to write, and not below their home, so the paths are shown from where they are."""
    home = tmp_path / "home"
    handout.hand_out(home / "notebooks")
    mine = handout.handout("clip_backend").in_notebooks(home / "notebooks")
    mine.write_text("/* half done */\n")
    project_copy = handout.handout("clip_backend").in_notebooks()
    before = project_copy.read_bytes() if project_copy.exists() else None
    monkeypatch.chdir(home if where == "home" else home / "notebooks")
    assert cli.main(["exercises", "reset", "clip_backend"]) == 0
    said = capsys.readouterr().out
    shown = "exercises/clip.c" if where == "notebooks" else "notebooks/exercises/clip.c"
    assert said.startswith(f"{shown}: the skeleton as shipped; your file is now {shown}.") and ".bak" in said, said
    assert mine.read_text() == handout.handout("clip_backend").shipped.read_text()
    assert [b.read_text() for b in mine.parent.glob("clip.c.*.bak")] == ["/* half done */\n"]
    assert (project_copy.read_bytes() if project_copy.exists() else None) == before


def test_reset_that_cannot_write_says_so_in_one_line(tmp_path, capsys) -> None:
    not_a_folder = tmp_path / "notebooks"
    not_a_folder.write_text("")
    assert cli.main(["exercises", "reset", "clip_backend", "--notebooks", str(not_a_folder)]) == 1
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "cannot reset clip_backend" in said and "--notebooks DIR" in said, said


@pytest.mark.parametrize("module", [c_lab, batch_strategy, native_exercise], ids=["clip", "tenant", "tf"])
def test_a_copy_edited_in_place_is_an_attempt_and_the_untouched_copy_is_not(tmp_path, module) -> None:
    """The learner's path: the handed-out copy, untouched, then edited in place (TODO marks kept)."""
    handout.hand_out(tmp_path)
    copy = module.HANDOUT.in_notebooks(tmp_path)
    with pytest.raises(NotImplementedError, match="next to this notebook"):
        module.read_answer(copy)
    copy.write_text(copy.read_text().replace("TODO(exercise)", "TODO(exercise) done:", 1))
    path, source = module.read_answer(copy)
    assert path == copy and "done:" in source


def test_the_direct_audit_judges_the_skeleton_as_shipped_not_the_learners_copy() -> None:
    assert shipped("exercises/clip.c") == c_lab.SKELETON
    assert shipped("exercises/tenant_batching.c") == batch_strategy.SKELETON
    assert shipped("exercises/other.c") == "exercises/other.c" and shipped(None) is None


OLD_FORMAT = {  # a function of the rest of the backend, as the old whole-backend files defined it
    "tf_gather_scatter": ("TRITONBACKEND_ModelInstanceExecute",
                          "TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(\n    TRITONBACKEND_ModelInstance* "
                          "instance, TRITONBACKEND_Request** requests, uint32_t count) {\n  return NULL;\n}\n"),
    "clip_backend": ("TRITONBACKEND_ModelInstanceExecute",
                     "TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(\n    TRITONBACKEND_ModelInstance* "
                     "instance, TRITONBACKEND_Request** requests, uint32_t count) {\n  return NULL;\n}\n"),
    "one_tenant_per_batch": ("request_tenant",
                             "static TRITONSERVER_Error* request_tenant(TRITONBACKEND_Request* request, "
                             "const char** tenant) {\n  *tenant = \"\";\n  return NULL;\n}\n"),
}


@pytest.mark.parametrize("module", [native_exercise, batch_strategy, c_lab], ids=["tf", "tenant", "clip"])
def test_an_old_whole_backend_answer_is_told_the_format_changed_and_how_to_reset(tmp_path, module) -> None:
    """A learner who completed an old exercise file (the whole backend or strategy in one file, as handed out
    before the file held only the functions to write) keeps that file: set-up never overwrites it. Its check
    says the format changed and names the reset; a comment naming such a function does not count."""
    handout.hand_out(tmp_path)
    function, definition = OLD_FORMAT[module.NAME]
    mine = module.HANDOUT.in_notebooks(tmp_path)
    mine.write_text(mine.read_text() + "\n" + definition)
    with pytest.raises(ExerciseError, match=rf"defines {function}\(\): it is the whole backend.*"
                                            rf"`lab-backends exercises reset {module.NAME}`.*\.bak"):
        module.read_answer(mine)
    assert handout.old_format(module.SKELETON.read_text(), module.HANDOUT) is None
    assert handout.old_format(f"/* {function}(...) is given */", module.HANDOUT) is None
