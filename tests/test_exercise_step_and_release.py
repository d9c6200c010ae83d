"""The ``step_and_release`` checker without a server: what it copies into its model, and how it judges records.

The audit (``lab-backends exercises audit --only step_and_release``) runs every answer on a real
server; these tests pin the two halves it rests on: the learner's function as the model will hold it
(and the skeleton seen as "not attempted" with or without its source), and the verdict drawn from the
model's records, fault by fault, on records made up here.
"""

from __future__ import annotations

import threading

import pytest

from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises import iterative, load_solution
from lab_backends.lessons.exercises.answers import load_cases
from lab_backends.lessons.exercises.iterative import Asked, Trail, judge, learner_step
from lab_backends.lessons.exercises.iterative_model import model_source, records_holding, token_of


def test_every_answer_of_the_audit_becomes_a_model_that_compiles() -> None:
    cases = load_cases(iterative.NAME)
    answers = [load_solution(iterative.NAME), *cases.alternatives,
               *(w.answer for w in cases.wrong if "helper" not in w.fault)]
    for answer in answers:
        source, name = learner_step(answer)
        compile(model_source(source, name), f"model.py ({name})", "exec")
        assert f"LEARNER_STEP = {name}" in model_source(source, name)


def test_the_skeleton_is_not_attempted_with_or_without_its_source() -> None:
    text = "def step(request, seq):\n    # your answer\n    raise NotImplementedError\n"
    namespace: dict = {}
    exec(compile(text, "answer cell", "exec"), namespace)  # no source to read: the audit's copy of the cell
    with pytest.raises(NotImplementedError):
        learner_step(namespace["step"])
    with pytest.raises(ExerciseError, match="lambda"):
        learner_step(lambda request, seq: None)
    with pytest.raises(ExerciseError, match="uses token_response"):
        learner_step(load_cases(iterative.NAME).wrong[-1].answer)


def _trail(label: str, length: int, steps: list[dict], first_execution: int = 1) -> Trail:
    asked = Asked(label, f"r-{label}", 7, length)
    full = [{"tokens": [], "final": False, "release": None, "error": "", "error_responses": 0, "without_token": [],
             "closed": ""} | s for s in steps]
    tokens = [t for s in full for t in s["tokens"]]
    return Trail(asked, full, list(range(first_execution, first_execution + len(full))), tokens, 1)


def _good(label: str, length: int, first_execution: int = 1) -> Trail:
    steps = [{"tokens": [token_of(7, i)], "release": iterative.RESCHEDULE} for i in range(length)]
    steps[-1] |= {"final": True, "release": None}
    return _trail(label, length, steps, first_execution)


def test_a_correct_run_passes_and_says_who_joined_when() -> None:
    message = judge([_good("A", 6), _good("B", 2, 3)])
    assert "each got exactly its tokens" in message and "joined at execution 3" in message
    with pytest.raises(ExerciseError, match="no request joined"):
        judge([_good("A", 2), _good("B", 2, 3)])


@pytest.mark.parametrize("steps, says", [
    ([{"tokens": [token_of(7, 0)], "release": iterative.ALL, "closed": "released without its final response"}],
     r"RELEASE_ALL instead of RESCHEDULE.*one step only"),
    ([{"tokens": [token_of(7, i)], "release": iterative.RESCHEDULE} for i in range(2)]
     + [{"tokens": [token_of(7, 2)], "closed": "released without its final response"}], r"never the final flag"),
    ([{"tokens": [token_of(7, i)], "release": iterative.RESCHEDULE} for i in range(2)]
     + [{"tokens": [token_of(7, 2)], "final": True, "release": iterative.RESCHEDULE,
         "closed": "rescheduled after its final response"}], r"RESCHEDULE at step 3, after its final response"),
    ([{"tokens": [token_of(7, i)], "release": iterative.RESCHEDULE} for i in range(4)]
     + [{"tokens": [token_of(7, 4)], "release": iterative.RESCHEDULE, "closed": "still rescheduled past its length"}],
     r"regardless of its length"),
    ([{"tokens": [token_of(7, i) for i in range(3)], "final": True}], r"3 tokens in one step"),
    ([{"error": "NameError: name 'x' is not defined", "closed": "step raised"}], r"your step raised NameError"),
    ([{"tokens": [1], "release": iterative.RESCHEDULE}, {"tokens": [2], "release": iterative.RESCHEDULE},
      {"tokens": [3], "final": True}], r"token 0 is 1, expected"),
])
def test_each_fault_is_named(steps: list[dict], says: str) -> None:
    with pytest.raises(ExerciseError, match=says):
        judge([_trail("A", 3, steps), _good("B", 1, 2)])


def test_records_written_after_the_last_response_are_waited_for(tmp_path) -> None:
    """The model writes an execution's line after its responses went out: a client can hold its last token
    and the final flag before the line exists (seen once in a fresh clone's audit under load). The checker
    waits for the records to hold everything received; here the last line lands 0.3 s late."""
    records = tmp_path / "records.jsonl"
    line = ('{{"execution": {e}, "t": 0, "requests": [{{"id": "r-A", "tokens": [{tok}], "final": {fin}, '
            '"closed": ""}}]}}\n')
    records.write_text(line.format(e=1, tok=token_of(7, 0), fin="false"))


    def write_the_last_line() -> None:
        with records.open("a") as out:
            out.write(line.format(e=2, tok=token_of(7, 1), fin="true"))

    late = threading.Timer(0.3, write_the_last_line)
    late.start()
    try:
        rows = records_holding(records, {"r-A": (2, True)})  # two tokens and the final flag received
    finally:
        late.join()
    assert [row["execution"] for row in rows] == [1, 2]
