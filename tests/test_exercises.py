"""lab_backends.lessons.exercises: every reference solution passes its checker against a real server, and
the checkers reject wrong answers (a checker that cannot fail checks nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab_backends.errors import ExerciseError
from lab_backends.lessons import exercises
from lab_backends.server.triton_server import TritonServer

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_every_exercise_has_a_solution_and_a_notebook_that_checks_it() -> None:
    assert len(exercises.EXERCISES) >= 2
    for name, ex in exercises.EXERCISES.items():
        assert exercises.solution_path(name).exists(), f"{name} has no solution file"
        notebook = NOTEBOOKS / f"{ex.notebook}.ipynb"
        assert notebook.exists(), f"{name} names notebook {ex.notebook}, which does not exist"
        assert re.search(rf'exercises\.check\(\\?"{name}\\?"', notebook.read_text()), (
            f"{ex.notebook} never checks {name}"
        )
    solutions = {p.stem for p in exercises.SOLUTIONS_DIR.glob("*.py")}
    assert solutions <= set(exercises.EXERCISES), (
        f"solutions without an exercise: {solutions - set(exercises.EXERCISES)}"
    )


def test_unknown_exercise_and_missing_answer() -> None:
    with pytest.raises(ExerciseError, match="kserve_json_body"):
        exercises.get("nope")
    with pytest.raises(ExerciseError, match="no solution file"):
        exercises.load_solution("nope")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One traced server for every check here (each start costs seconds on a busy machine)."""
    trace_file = tmp_path_factory.mktemp("exercise-trace") / "trace.json"
    with TritonServer(models=["cost_model"], trace_file=trace_file, trace_log_frequency=1) as started:
        yield started


@pytest.mark.server
@pytest.mark.parametrize("name", sorted(exercises.EXERCISES))
def test_reference_solution_passes(name: str, server) -> None:
    result = exercises.check(name, exercises.load_solution(name), server, quiet=True)
    assert result.passed and result.attempted, result.message


@pytest.mark.server
def test_check_starts_its_own_server_when_given_none() -> None:
    result = exercises.check("kserve_json_body", exercises.load_solution("kserve_json_body"), quiet=True)
    assert result.passed


@pytest.mark.server
def test_kserve_json_body_rejects_wrong_answers(server) -> None:

    def no_batch_dim(x):
        return {"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": x.flatten().tolist()}]}

    def not_implemented(x):
        raise NotImplementedError

    with pytest.raises(ExerciseError, match="HTTP 400.*unexpected shape"):
        exercises.check("kserve_json_body", no_batch_dim, server, quiet=True)
    with pytest.raises(ExerciseError, match="must return a dict"):
        exercises.check("kserve_json_body", lambda x: "{}", server, quiet=True)
    with pytest.raises(ExerciseError, match="not JSON-serialisable"):
        exercises.check("kserve_json_body", lambda x: {"inputs": [{"name": "INPUT0", "data": x}]}, server, quiet=True)
    result = exercises.check("kserve_json_body", not_implemented, server, quiet=True)
    assert not result.attempted and not result and "not attempted" in result.message


@pytest.mark.server
def test_longest_queue_rejects_the_shortest(server) -> None:

    def shortest(log):
        top = log.requests[log.requests["depth"] == 0]
        return top.loc[top["queue_ms"].idxmin(), "request_id"]

    with pytest.raises(ExerciseError, match="queued longest"):
        exercises.check("longest_queue", shortest, server, quiet=True)


@pytest.mark.server
def test_tune_the_batcher_rejects_a_delay_that_breaks_the_p99_bound(server) -> None:
    """A 200 ms queue delay blows the p99 bound and, every batch waiting it out, the throughput too:
    the checker must name both misses, not only the first (32 in flight never fill max_batch_size 64,
    so p99 >= 200 ms and at most ~160 req/s, under 2x the unbatched ~85)."""
    too_patient = {"dynamic_batching": {"max_queue_delay_microseconds": 200000}}
    with pytest.raises(ExerciseError, match=r"(?s)throughput must reach 4x.*p99 must stay at or under 100 ms"):
        exercises.check("tune_the_batcher", too_patient, server, quiet=True)
