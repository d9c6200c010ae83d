"""Notebook 09's C exercise: its checker refuses wrong backends (the solution's pass is in test_exercises).

Each refusal is cheap on purpose: the skeleton and the double free are refused before any build,
the warning at build time, and only the wrong clamp needs a server (the checker's own).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_backends.errors import ExerciseError
from lab_backends.lessons import c_lab, exercises

SOLUTION = exercises.load_solution(c_lab.NAME)


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    source = SOLUTION.read_text()
    assert old in source, old
    path = tmp_path / "clip.c"
    path.write_text(source.replace(old, new))
    return path


def test_the_skeleton_is_not_attempted_yet_and_builds() -> None:
    result = exercises.check(c_lab.NAME, c_lab.SKELETON, quiet=True)
    assert not result.attempted and "not attempted" in result.message
    assert "complete the four TODO(exercise) places" in result.message and "NotImplementedError" not in result.message
    # The skeleton compiles as handed out, so a learner can build step by step.
    import tempfile

    from lab_backends.server import cbackend

    with tempfile.TemporaryDirectory() as tmp:
        assert cbackend.build(c_lab.SKELETON, "clip", tmp, extra_flags=("-Werror",)).is_file()


def test_a_response_deleted_after_sending_is_refused_before_building(tmp_path) -> None:
    path = _variant(tmp_path, "TRITONSERVER_ErrorDelete(err);\n      continue;",
                    "TRITONSERVER_ErrorDelete(err);\n      TRITONBACKEND_ResponseDelete(response);\n      continue;")
    with pytest.raises(ExerciseError, match="ResponseDelete.*Triton's"):
        exercises.check(c_lab.NAME, path, quiet=True)


def test_a_warning_fails_the_build(tmp_path) -> None:
    path = _variant(tmp_path, "uint64_t batch_size = 0;", "uint64_t batch_size = 0;\n  int unused = 0;")
    with pytest.raises(ExerciseError, match="(?s)does not build.*unused variable"):
        exercises.check(c_lab.NAME, path, quiet=True)


@pytest.mark.server
def test_a_wrong_clamp_is_refused_with_what_came_back(tmp_path) -> None:
    path = _variant(tmp_path, "fminf(fmaxf(data[k], bounds->lo), bounds->hi)", "fmaxf(data[k], bounds->lo)")
    with pytest.raises(ExerciseError, match="came back as"):
        exercises.check(c_lab.NAME, path, quiet=True)


def test_a_finished_file_that_keeps_the_skeletons_comments_is_an_attempt(tmp_path) -> None:
    """The skeleton's header says "Complete the four places marked TODO(exercise)": keeping it is fine."""
    header = c_lab.SKELETON.read_text().split("*/", 1)[0] + "*/\n"
    assert c_lab.TODO_MARK in header
    path = tmp_path / "clip.c"
    path.write_text(header + SOLUTION.read_text())
    assert c_lab.read_answer(path) == (path, path.read_text())  # not "not attempted": the checks run
    reformatted = tmp_path / "skeleton.c"
    reformatted.write_text(c_lab.SKELETON.read_text().replace("\n", "\n\n"))
    with pytest.raises(NotImplementedError):
        c_lab.read_answer(reformatted)  # the skeleton with blank lines added is still the skeleton
