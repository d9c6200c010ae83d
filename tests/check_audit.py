"""The exercise audit's record (``test-artifacts/audit.json``): every answer judged on the learner's path too.

Not collected by ``pytest tests`` (the name does not start with ``test_``): ``make test`` runs it
right after ``lab-backends exercises audit --record test-artifacts/audit.json``, so that the checkers'
work on a real server is done once and read twice. Run it by hand after such an audit.

What it holds the audit to, beyond the audit's own exit code: the two C exercises were judged the
way notebooks 09 and 09b tell the learner to answer, the reference and every wrong answer written
over ``exercises/<file>.c`` in a copy of the notebooks folder, judged by the notebook's own check
cell; and no answer of any exercise got another verdict on that path than when called directly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab_backends.lessons.exercises import EXERCISES
from lab_backends.lessons.exercises.answers import MIN_ALTERNATIVES, MIN_WRONG, notebook_cells
from lab_backends.paths import NOTEBOOK_DIR, PROJECT_ROOT

RECORD = Path(os.environ.get("LAB_AUDIT_RECORD", PROJECT_ROOT / "test-artifacts" / "audit.json"))
#: A memory error, a crash or a hang in a C answer gets its verdict within this (issue 47), on either path.
VERDICT_WITHIN_S = 60
#: The refusals that name such a fault (lab_backends/lessons/native_faults.py and the checkers' deadlines).
FAULT_NAMED = ("AddressSanitizer found", "tritonserver died", "tritonserver stopped answering", "no answer ")
IN_PLACE = {"clip_backend": "clip.c", "one_tenant_per_batch": "tenant_batching.c",
            "tf_gather_scatter": "tf_gather_scatter.c", "executorch_binding": "executorch_binding.cc"}


@pytest.fixture(scope="module")
def record() -> dict[str, dict]:
    if not RECORD.exists():
        pytest.fail(f"no {RECORD}: run `lab-backends exercises audit --record {RECORD}` first")
    return {v["name"]: v for v in json.loads(RECORD.read_text())}


def test_every_exercise_was_judged_on_both_paths_alike(record) -> None:
    assert set(record) == set(EXERCISES), "the audit left exercises out"
    for name, verdict in record.items():
        assert verdict["as_taught"] is not None, f"{name}: the learner's path was not run"
        direct = {j["label"]: j["outcome"] for j in verdict["direct"]}
        taught = {j["label"]: j["outcome"] for j in verdict["as_taught"]}
        assert direct == taught, f"{name}: the paths disagree: {verdict['line']}"
        wrong = [j for j in verdict["as_taught"] if j["label"].startswith("wrong")]
        alternatives = [j for j in verdict["as_taught"] if j["label"].startswith("alternative")]
        assert len(wrong) >= MIN_WRONG and all(j["outcome"] == "refused" for j in wrong), name
        assert len(alternatives) >= MIN_ALTERNATIVES and all(j["outcome"] == "pass" for j in alternatives), name
        assert verdict["ok"], verdict["line"]


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_a_c_answer_edited_in_place_is_judged_by_the_notebooks_own_cell(record, name) -> None:
    judged = {j["label"]: j for j in record[name]["as_taught"]}
    notebook = EXERCISES[name].notebook + ".ipynb"
    reference = judged["reference"]
    assert reference["outcome"] == "pass", reference
    assert f"exercises/{IN_PLACE[name]} written in place" in reference["where"], reference["where"]
    # The cell that judged it is the notebook's own: the index names a code cell calling this check.
    index = int(reference["where"].split(" code cell ")[1].split(",")[0])
    assert reference["where"].startswith(notebook)
    assert f'exercises.check("{name}", "exercises/{IN_PLACE[name]}")' in notebook_cells(NOTEBOOK_DIR / notebook)[index]
    wrong = [j for label, j in judged.items() if label.startswith("wrong")]
    assert wrong and all(j["outcome"] == "refused" and "written in place" in j["where"] for j in wrong)
    assert judged["skeleton"]["outcome"] == "not-attempted" and "as shipped" in judged["skeleton"]["where"]


#: Each C exercise's memory-error mistakes (words of their labels) that must be named as a fault on both paths.
MEMORY_MISTAKES = {
    "tf_gather_scatter": ("assumes one row per request", "deletes the result tensor",
                          "frees each response after sending"),
    "clip_backend": ("writes every row into it", "frees the copy of the input before clamping it"),
    "one_tenant_per_batch": ("copies the tenant into malloc(strlen(tenant)) bytes",
                             "keeps the request's pointer and frees it"),
    "executorch_binding": ("sizes b->input for one row",),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_a_c_answer_that_corrupts_memory_is_named_within_a_minute(record, name) -> None:
    """The learner's 09c gather that copied a 5-row request into a 1-row batch hung its check for 20 minutes; now
    every fault of a C answer is named (AddressSanitizer: kind, access, the learner's line) within a minute."""
    faults = [(path, j) for path in ("direct", "as_taught") for j in record[name][path]
              if j["label"].startswith("wrong") and any(word in j["message"] for word in FAULT_NAMED)]
    named = " | ".join(j["label"] for _, j in faults)
    for mistake in MEMORY_MISTAKES[name]:
        assert named.count(mistake) == 2, f"{name}'s '{mistake}' was not named as a memory fault on both paths: {named}"
    slow = [(path, j["label"], j["seconds"]) for path, j in faults
            if "seconds" not in j or j["seconds"] > VERDICT_WITHIN_S]
    assert not slow, f"{name}: verdicts on memory errors later than {VERDICT_WITHIN_S} s (or not timed): {slow}"
