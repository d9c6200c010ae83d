"""Notebook 09's C exercise, its pieces: the skeleton, and the source checks the checker runs.

The checker itself meets its reference, 7 wrong and 2 alternative answers in the exercise audit
(tests/exercise_cases/clip_backend.py, run by `make test`); here the static rules are tested on
their own, against sources that should and should not pass them.
"""

from __future__ import annotations

import pytest

from lab_backends.lessons import c_lab, c_source, exercises

SOLUTION = exercises.load_solution(c_lab.NAME)


def test_the_skeleton_is_not_attempted_yet_and_builds() -> None:
    result = exercises.check(c_lab.NAME, c_lab.SKELETON, quiet=True)
    assert not result.attempted and "not attempted" in result.message
    assert "complete the four TODO(exercise) places" in result.message and "NotImplementedError" not in result.message
    # The skeleton compiles as handed out, so a learner can build step by step.
    import tempfile

    from lab_backends.server import cbackend

    with tempfile.TemporaryDirectory() as tmp:
        assert cbackend.build(c_lab.SKELETON, "clip", tmp, extra_flags=("-Werror",)).is_file()


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


def _execute(send_failed: str) -> str:
    return ("TRITONSERVER_Error* Execute(void) {\n  TRITONSERVER_Error* err = NULL;\n"
            "  err = TRITONBACKEND_ResponseSend(response, 0, NULL);\n"
            f"  if (err != NULL) {{\n    {send_failed}\n  }}\n  return NULL;\n}}\n")


def test_the_error_of_a_failed_send_must_be_freed() -> None:
    assert c_source.send_errors_leaked(_execute("TRITONSERVER_ErrorDelete(err);\n    continue;")) == []
    helper = "static void drop(TRITONSERVER_Error* e) { TRITONSERVER_ErrorDelete(e); }\n"
    assert c_source.send_errors_leaked(helper + _execute("drop(err);")) == []
    leaked = c_source.send_errors_leaked(_execute("LAB_LOG(1, \"send failed\");"))
    assert len(leaked) == 1 and "err is never passed to TRITONSERVER_ErrorDelete" in leaked[0]
    other = c_source.send_errors_leaked(_execute("TRITONSERVER_ErrorDelete(other);"))
    assert len(other) == 1, "freeing some other error does not free this one"
    untested = "void f(void) {\n  err = TRITONBACKEND_ResponseSend(r, 0, NULL);\n}\n"
    assert "never tested" in c_source.send_errors_leaked(untested)[0]


def test_model_finalize_must_free_the_state() -> None:
    finalize = ("TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {{\n"
                "  void* state = NULL;\n  TRITONBACKEND_ModelState(model, &state);\n  {}\n  return NULL;\n}}\n")
    assert c_source.finalize_frees_state(finalize.format("free(state);"))
    helper = "static void release(void* p) { free(p); }\n"
    assert c_source.finalize_frees_state(helper + finalize.format("release(state);"))
    assert not c_source.finalize_frees_state(finalize.format("(void)state;"))
    assert not c_source.finalize_frees_state(finalize.format("/* free(state); */"))  # a comment frees nothing
    assert not c_source.finalize_frees_state(c_lab.SKELETON.read_text())
    assert c_source.finalize_frees_state(SOLUTION.read_text())


def test_a_bound_is_named_as_a_word_not_as_part_of_load() -> None:
    """The old check (`"lo" not in message`) could not fail: every load error says "load"."""
    assert not c_lab._names("failed to load 'clip_bad_bound': load failed", "lo")
    assert c_lab._names("clip: model 'clip_bad_bound': parameter 'lo' must be a finite number", "lo")
    assert c_lab._names("lo (2) must not exceed hi (1)", "lo", "hi")
    assert not c_lab._names("the lower bound exceeds the upper one", "lo", "hi")
