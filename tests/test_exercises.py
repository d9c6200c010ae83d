"""lab_backends.lessons.exercises: the registry, the one-line verdicts, and the audit's own machinery.

Every checker meets its skeleton, reference, wrong and alternative answers in the exercise audit
(``lab-backends exercises audit``, a step of ``make test``; cases in tests/exercise_cases/). The
tests here check what the audit rests on, with a throw-away exercise and no server, so that an
audit that could not fail would be caught here.
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path

import pytest

from lab_backends import cli
from lab_backends.errors import ExerciseError
from lab_backends.lessons import exercises
from lab_backends.lessons.exercises import as_taught, audit
from lab_backends.lessons.exercises.answers import CRASH_TRIES
from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.lessons.exercises.registry import load_module

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
COUNTS = r"skeleton=(\S+) reference=(\S+) wrong=(\d+)/(\d+) rejected alternative=(\d+)/(\d+) accepted"
LINE = re.compile(rf"^(\w+) {COUNTS}; as-taught: {COUNTS}$")
#: The throw-away exercise as a file: the as-taught path runs in another process, which registers it from here.
TOY_PLUGIN = """
from pathlib import Path

from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises import registry
from lab_backends.lessons.exercises.registry import EXERCISES, Exercise


def checker(answer, server, factor=2):
    if answer is None:
        raise NotImplementedError("write double(x)")
    got = answer(3)
    if got != factor * 3:
        raise ExerciseError(f"double(3) returned {got!r}, expected {factor * 3}: multiply by {factor}")
    return "double(3) == 6"


TOY = Exercise("toy_double", "toy", "double x", (), checker)
if __name__ == "as_taught_plugin":  # in the audit's fresh process only (the tests register it with monkeypatch)
    EXERCISES["toy_double"] = TOY
    registry.SOLUTIONS_DIR = Path(__file__).parent / "solutions"
"""


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


def test_every_exercise_has_enough_audit_cases() -> None:
    for name in exercises.EXERCISES:
        cases = audit.load_cases(name)
        assert len(cases.wrong) >= audit.MIN_WRONG and len(cases.alternatives) >= audit.MIN_ALTERNATIVES, name
        assert all(isinstance(w, Wrong) and w.fault and w.says for w in cases.wrong), name


def test_every_skeleton_is_read_from_its_notebook() -> None:
    """The audit finds each notebook's answer as handed out: a function, a string, a path or None."""
    for name, ex in exercises.EXERCISES.items():
        skeleton = audit.notebook_skeleton(ex)
        assert skeleton is None or callable(skeleton) or isinstance(skeleton, (str, Path)), (name, skeleton)


def test_unknown_exercise_and_missing_answer() -> None:
    with pytest.raises(ExerciseError, match="kserve_json_body"):
        exercises.get("nope")
    with pytest.raises(ExerciseError, match="no solution file"):
        exercises.load_solution("nope")


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """A throw-away exercise 'toy_double' (answer(x) == 2 * x), its notebook, solution and cases.

    The audit's learner path runs in the test process (``as_taught.judge_all``) except where a test
    says otherwise: one test runs it in a fresh process, as ``make test``'s audit does.
    """
    plugin = tmp_path / "toy_plugin.py"
    plugin.write_text(TOY_PLUGIN)
    monkeypatch.setitem(exercises.EXERCISES, "toy_double", load_module(plugin, "toy_plugin").TOY)
    notebooks, solutions, cases = tmp_path / "notebooks", tmp_path / "solutions", tmp_path / "cases"
    for folder in (notebooks, solutions, cases):
        folder.mkdir()
    cells = [{"cell_type": "code", "source": "from lab_backends.lessons import exercises\n"},
             {"cell_type": "code", "source": "double = None  # your answer\n"},
             {"cell_type": "markdown", "source": "check it"},
             {"cell_type": "code", "source": 'print("task")\nresult = exercises.check("toy_double", double)\n'}]
    (notebooks / "toy.ipynb").write_text(__import__("json").dumps({"cells": cells}))
    (solutions / "toy_double.py").write_text("def answer(x):\n    return x * 2\n")
    monkeypatch.setattr(exercises.registry, "SOLUTIONS_DIR", solutions)
    monkeypatch.setattr(audit.audit_one, "__defaults__", (None, cases, notebooks, as_taught.judge_all))
    return notebooks, cases, plugin


def _cases(folder: Path, text: str) -> None:
    (folder / "toy_double.py").write_text("from lab_backends.lessons.exercises.audit import Wrong\n"
                                          + textwrap.dedent(text))


def test_the_audit_line_and_its_verdict(toy) -> None:
    """Both paths, the learner's in a fresh process as ``make test`` runs it, agree on every answer."""
    notebooks, cases, plugin = toy
    _cases(cases, """
        WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5"), Wrong("squares", lambda x: x * x, r"returned 9"),
                 Wrong("zero", lambda x: 0, r"returned 0")]
        ALTERNATIVES = [lambda x: x + x]
    """)
    fresh = functools.partial(as_taught.in_fresh_process, plugin=plugin)
    verdict = audit.audit_one("toy_double", cases_dir=cases, notebooks_dir=notebooks, learner_path=fresh)
    counts = "skeleton=not-attempted reference=pass wrong=3/3 rejected alternative=1/1 accepted"
    assert verdict.line() == f"toy_double {counts}; as-taught: {counts}"
    assert verdict.ok and verdict.problems == [] and LINE.match(verdict.line())


def test_the_learner_path_is_the_check_cell_as_the_notebook_has_it(toy) -> None:
    """A check cell that uses a name its notebook never imports fails as taught though it passes directly
    (notebook 10's fallbacks once did): a shortfall, named per answer."""
    notebooks, cases, _ = toy
    _cases(cases, """
        WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5")] * 3
        ALTERNATIVES = [lambda x: x + x]
    """)
    book = notebooks / "toy.ipynb"
    call = r'toy_double\", double)\n'
    book.write_text(book.read_text().replace(call, call + r"observability.note()\n"))
    verdict = audit.audit_one("toy_double", cases_dir=cases, notebooks_dir=notebooks)
    assert verdict.rejected == 3 and verdict.accepted == 1 and verdict.reference == "pass"  # the direct path
    assert verdict.as_taught.reference == "error" and not verdict.ok
    assert "reference: direct pass, as-taught error: the learner's path disagrees" in verdict.problems
    assert any("uses 'observability', which no cell above binds" in p for p in verdict.problems), verdict.problems


def test_an_answer_the_check_cell_assigns_itself_replaces_that_line(toy) -> None:
    """``my_batcher = None  # your override`` inside the check cell is the line a learner edits."""
    notebooks, cases, _ = toy
    _cases(cases, """
        WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5")] * 3
        ALTERNATIVES = [lambda x: x + x]
    """)
    book = notebooks / "toy.ipynb"
    call = "result = exercises.check("
    book.write_text(book.read_text().replace(call, "double = None  # yours\\n" + call))
    verdict = audit.audit_one("toy_double", cases_dir=cases, notebooks_dir=notebooks)
    assert verdict.ok, verdict.problems
    assert verdict.as_taught.skeleton == "not-attempted" and verdict.as_taught.accepted == 1


def test_the_audit_falls_short_for_each_kind_of_unfair_checker(toy) -> None:
    notebooks, cases, _ = toy
    _cases(cases, """
        WRONG = [Wrong("correct after all", lambda x: 2 * x, r"returned"),
                 Wrong("refused for another reason", lambda x: x + 1, r"negative"),
                 Wrong("crashes", lambda x: x / 0, r"returned")]
        ALTERNATIVES = [lambda x: x * 3]
    """)
    verdict = audit.audit_one("toy_double", cases_dir=cases, notebooks_dir=notebooks)
    assert not verdict.ok and verdict.rejected == 0 and verdict.accepted == 0
    assert verdict.line().endswith("wrong=0/3 rejected alternative=0/1 accepted")
    text = "\n".join(verdict.problems)
    assert "correct after all): pass" in text and "refused for another reason): refused" in text
    assert "crashes): error, expected a refusal matching /returned/: ZeroDivisionError" in text
    assert "alternative 1: refused" in text


#: An alternative under which "the server crashes" on every odd call, whichever path calls it (a file counts the
#: calls: the two paths may or may not share the cases module).
CRASHING_ALTERNATIVE = """
    from pathlib import Path
    from lab_backends.errors import ServerCrashed
    CALLS = Path(__file__).with_suffix(".calls")

    def crashes_first(x, every=2):
        n = int(CALLS.read_text()) if CALLS.exists() else 0
        CALLS.write_text(str(n + 1))
        if n % every == 0:
            raise ServerCrashed("tritonserver (pid 1) killed by signal 11 (SIGSEGV). The log says: Signal (11).")
        return x + x

    WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5")] * 3
"""


def test_an_answer_the_server_crashed_under_is_judged_once_more_and_the_audit_says_so(toy) -> None:
    """The audit's re-judging after a server crash (a branch a quiet machine never takes), forced: the
    alternative's first try on each path "crashes the server", its second passes; a note names the crash."""
    _, cases, _ = toy
    _cases(cases, CRASHING_ALTERNATIVE + "    ALTERNATIVES = [crashes_first]\n")
    lines: list[str] = []
    [verdict] = audit.audit(["toy_double"], emit=lines.append)
    assert verdict.ok and verdict.accepted == 1 and verdict.as_taught.accepted == 1, verdict.problems
    notes = [line for line in lines if line.startswith("  note: alternative 1")]
    assert [n.split(" (")[1].split(")")[0] for n in notes] == ["direct", "as-taught"], lines
    assert all("the server crashed under it: ServerCrashed: tritonserver (pid 1) killed by signal 11" in n
               for n in notes)


def test_an_answer_the_server_crashes_under_every_time_is_an_error_after_two_tries(toy) -> None:
    _, cases, _ = toy
    _cases(cases, CRASHING_ALTERNATIVE + "    ALTERNATIVES = [lambda x: crashes_first(x, every=1)]\n")
    verdict = audit.audit_one("toy_double", cases_dir=cases)
    [judged] = [j for j in verdict.judged if j.label == "alternative 1"]
    assert judged.outcome == "error" and judged.message.startswith("ServerCrashed:") and judged.again
    assert (cases / "toy_double.calls").read_text() == str(2 * CRASH_TRIES)  # both paths, each bounded
    assert not verdict.ok and verdict.accepted == 0


def test_too_few_cases_and_a_skeleton_that_is_not_handed_out_fall_short(toy) -> None:
    notebooks, cases, _ = toy
    _cases(cases, """
        WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5")]
        ALTERNATIVES = []
    """)
    cell = notebooks / "toy.ipynb"
    cell.write_text(cell.read_text().replace("double = None", "double = lambda x: 2 * x"))
    verdict = audit.audit_one("toy_double", cases_dir=cases, notebooks_dir=notebooks)
    assert verdict.skeleton == "pass" and not verdict.ok
    assert any("needs >= 3 wrong answers" in p for p in verdict.problems)


def test_a_refused_answer_is_one_line_and_raises_only_on_request(toy, capsys, monkeypatch) -> None:
    result = exercises.check("toy_double", lambda x: x + 1)
    out = capsys.readouterr().out
    assert out == "✗ toy_double: double(3) returned 4, expected 6: multiply by 2\n"
    assert result.attempted and not result.passed and "Traceback" not in out
    with pytest.raises(ExerciseError, match="returned 4"):
        exercises.check("toy_double", lambda x: x + 1, traceback=True)
    monkeypatch.setenv("LAB_TRACEBACK", "1")
    with pytest.raises(ExerciseError):
        exercises.check("toy_double", lambda x: x + 1, quiet=True)
    assert exercises.check("toy_double", None, quiet=True).attempted is False
    assert exercises.check("toy_double", lambda x: x * 10, quiet=True, factor=10).passed  # inputs reach the checker


def test_the_command_exits_non_zero_when_an_exercise_falls_short(toy, monkeypatch, capsys) -> None:
    notebooks, cases, _ = toy
    _cases(cases, """
        WRONG = [Wrong("adds", lambda x: x + 2, r"returned 5")] * 3
        ALTERNATIVES = [lambda x: x * 3]
    """)
    monkeypatch.setattr(audit, "CASES_DIR", cases)
    monkeypatch.setattr(audit, "NOTEBOOKS_DIR", notebooks)
    monkeypatch.setattr(audit.audit_one, "__defaults__", (None, cases, notebooks, as_taught.judge_all))
    assert cli.main(["exercises", "audit", "--only", "toy_double"]) == 1
    captured = capsys.readouterr()
    assert LINE.match(captured.out.splitlines()[0]) and "alternative=0/1" in captured.out
    assert "1 of 1 exercises fall short: toy_double" in captured.err
    assert cli.main(["exercises", "audit", "--only", "nope"]) == 2


@pytest.mark.server
def test_check_starts_its_own_server_when_given_none() -> None:
    result = exercises.check("kserve_json_body", exercises.load_solution("kserve_json_body"), quiet=True)
    assert result.passed and result.message.startswith("✓ kserve_json_body:")


def test_the_workers_get_about_equal_shares_of_the_audit() -> None:
    names = sorted(exercises.EXERCISES) + ["new_unmeasured"]
    groups = audit.balanced(names, 3)
    assert sorted(n for g in groups for n in g) == sorted(names)  # each exactly once
    loads = [sum(audit.TYPICAL_S.get(n, audit.DEFAULT_S) for n in g) for g in groups]
    assert max(loads) - min(loads) <= max(audit.TYPICAL_S.values())
    assert set(audit.TYPICAL_S) == set(exercises.EXERCISES), "measure the new exercise and add it to TYPICAL_S"
    assert audit.balanced(["a"], 3) == [["a"]]
