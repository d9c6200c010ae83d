"""The exercise audit: is every checker fair? (``lab-backends exercises audit``, run by ``make test``)

A checker is fair when it accepts every correct answer, refuses plausible wrong ones with a message
that names the fault, and says "not attempted" only for what the notebook hands out untouched. The
audit runs, for every registered exercise:

- the **skeleton**, read from the notebook itself (the answer cell as shipped, so the audit cannot
  drift from what a learner sees) -> must be "not attempted";
- the **reference** (``notebooks/solutions/<name>.*``) -> must pass;
- the **wrong answers** in ``tests/exercise_cases/<name>.py`` (``WRONG``, at least 3) -> each must
  be refused with a message matching its ``says`` pattern (the fault named, not any refusal);
- the **alternatives** there (``ALTERNATIVES``, at least 1: correct answers shaped unlike the
  reference) -> each must pass.

It prints exactly one line per exercise,
``NAME skeleton=not-attempted reference=pass wrong=K/N rejected alternative=M/N accepted``, then
one indented line per shortfall, and exits non-zero when any exercise falls short.

Why a command and not only tests: the same cases serve a maintainer who changes a checker (run it
for one exercise with ``--only``) and CI, and the line is the evidence a closing note quotes.
"""

from __future__ import annotations

import ast
import atexit
import concurrent.futures
import contextlib
import io
import json
import multiprocessing
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from lab_backends.errors import ExerciseError
from lab_backends.lessons import exercises
from lab_backends.lessons.exercises.registry import (
    EXERCISES,
    Exercise,
    check,
    get,
    load_module,
    load_solution,
    started_for,
)
from lab_backends.paths import PROJECT_ROOT

CASES_DIR = PROJECT_ROOT / "tests" / "exercise_cases"
NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
MIN_WRONG = 3
MIN_ALTERNATIVES = 1


@dataclass(frozen=True)
class Wrong:
    """A plausible wrong answer: ``fault`` says what is wrong; the refusal must match ``says``."""

    fault: str
    answer: Any
    says: str


class SourceVariants:
    """Files of wrong or alternative answers made from a reference source, one fault (or change) each.

    Written to a scratch folder removed when the process exits: the audit passes checkers a path,
    as a learner does. ``variant(name, (old, new), ...)`` fails loudly when ``old`` is no longer in
    the reference, so a case cannot silently turn into the reference itself.
    """

    def __init__(self, reference: str, prefix: str, suffix: str = ".c") -> None:
        self.reference, self.suffix = reference, suffix
        self.folder = Path(tempfile.mkdtemp(prefix=f"audit-{prefix}-"))
        atexit.register(shutil.rmtree, self.folder, True)

    def file(self, name: str, text: str) -> Path:
        path = self.folder / f"{name}{self.suffix}"
        path.write_text(text)
        return path

    def variant(self, name: str, *swaps: tuple[str, str]) -> Path:
        text = self.reference
        for old, new in swaps:
            if old not in text:
                raise ExerciseError(f"audit case {name!r}: {old!r} is not in the reference any more")
            text = text.replace(old, new)
        return self.file(name, text)


@dataclass(frozen=True)
class Cases:
    """The wrong and alternative answers of one exercise, from ``tests/exercise_cases/<name>.py``."""

    name: str
    wrong: tuple[Wrong, ...]
    alternatives: tuple[Any, ...]


@dataclass
class Verdict:
    """What the audit found for one exercise; :meth:`line` is the one line it prints."""

    name: str
    skeleton: str = "missing"
    reference: str = "missing"
    rejected: int = 0
    wrong: int = 0
    accepted: int = 0
    alternatives: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.skeleton == "not-attempted" and self.reference == "pass"
                and self.wrong >= MIN_WRONG and self.rejected == self.wrong
                and self.alternatives >= MIN_ALTERNATIVES and self.accepted == self.alternatives)

    def line(self) -> str:
        return (f"{self.name} skeleton={self.skeleton} reference={self.reference} "
                f"wrong={self.rejected}/{self.wrong} rejected alternative={self.accepted}/{self.alternatives} accepted")


def load_cases(name: str, cases_dir: Path = CASES_DIR) -> Cases:
    """``WRONG`` and ``ALTERNATIVES`` of ``<cases_dir>/<name>.py``."""
    path = cases_dir / f"{name}.py"
    if not path.exists():
        raise ExerciseError(f"no audit cases for {name!r}: write {path} with WRONG (>= {MIN_WRONG}) and "
                            f"ALTERNATIVES (>= {MIN_ALTERNATIVES})")
    module = load_module(path, f"exercise_cases_{name}")
    return Cases(name, tuple(getattr(module, "WRONG", ())), tuple(getattr(module, "ALTERNATIVES", ())))


def notebook_skeleton(ex: Exercise, notebooks_dir: Path = NOTEBOOKS_DIR) -> Any:
    """The answer the notebook hands out, evaluated as the notebook would.

    Finds the cell that calls ``exercises.check("<name>", ANSWER, ...)``, runs the statements of that
    cell before the call and, when ANSWER is a name the cell does not bind, the nearest earlier code
    cell that binds it; then evaluates ANSWER. The namespace holds what those cells use from the
    notebook's first cell (``exercises``, ``PROJECT_ROOT``); nothing else of the notebook runs.
    """
    path = notebooks_dir / f"{ex.notebook}.ipynb"
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    for index, source in enumerate(sources):
        call = _check_call(source, ex.name)
        if call is None:
            continue
        statement, expr = call
        namespace: dict[str, Any] = {"exercises": exercises, "PROJECT_ROOT": PROJECT_ROOT}
        tree = ast.parse(source)
        before = ast.Module(body=tree.body[:statement], type_ignores=[])
        bound = {n.id for n in ast.walk(before) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        wanted = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - bound - set(namespace)
        for name in wanted:
            cell = next((s for s in reversed(sources[:index]) if name in _bound_names(s)), None)
            if cell is None:
                raise ExerciseError(f"{path.name}: no cell before the check binds {name!r}")
            exec(compile(cell, f"{path.name} (answer cell)", "exec"), namespace)  # our own notebook's cell
        exec(compile(before, f"{path.name} (check cell)", "exec"), namespace)
        return eval(compile(ast.Expression(expr), path.name, "eval"), namespace)
    raise ExerciseError(f"{path.name} never calls exercises.check({ex.name!r}, ...)")


def _check_call(source: str, name: str) -> tuple[int, ast.expr] | None:
    """(index of the top-level statement, the answer expression) of ``exercises.check(name, answer, ...)``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for i, statement in enumerate(tree.body):
        for node in ast.walk(statement):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "check"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) and node.args[0].value == name):
                return i, node.args[1]
    return None


def _bound_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def audit_one(name: str, server: Any = None, cases_dir: Path = CASES_DIR,
              notebooks_dir: Path = NOTEBOOKS_DIR) -> Verdict:
    """Run every case of exercise ``name``; ``server`` is handed to the checker (None: it starts its own)."""
    ex = get(name)
    verdict = Verdict(name)
    started = time.monotonic()

    def run(answer: Any) -> tuple[str, str]:
        """('not-attempted' | 'pass' | 'refused' | 'error', message)."""
        try:
            result = check(name, answer, server, quiet=True)
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported with its type
            return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not result.attempted:
            return "not-attempted", result.message
        return ("pass" if result.passed else "refused"), result.message

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the cells print the task: not the audit's business
            skeleton = notebook_skeleton(ex, notebooks_dir)
        verdict.skeleton, message = run(skeleton)
    except ExerciseError as exc:
        verdict.skeleton, message = "missing", str(exc)
    if verdict.skeleton != "not-attempted":
        verdict.problems.append(f"skeleton: {verdict.skeleton}: {_first(message)}")
    try:
        verdict.reference, message = run(load_solution(name))
    except ExerciseError as exc:
        verdict.reference, message = "missing", str(exc)
    if verdict.reference != "pass":
        verdict.problems.append(f"reference: {verdict.reference}: {_first(message)}")
    try:
        cases = load_cases(name, cases_dir)
    except ExerciseError as exc:
        verdict.problems.append(str(exc))
        return verdict
    verdict.wrong, verdict.alternatives = len(cases.wrong), len(cases.alternatives)
    for case in cases.wrong:
        outcome, message = run(case.answer)
        if outcome == "refused" and re.search(case.says, message, re.S):
            verdict.rejected += 1
        else:
            verdict.problems.append(f"wrong ({case.fault}): {outcome}, expected a refusal matching "
                                    f"/{case.says}/: {_first(message)}")
    for i, answer in enumerate(cases.alternatives, 1):
        outcome, message = run(answer)
        if outcome == "pass":
            verdict.accepted += 1
        else:
            verdict.problems.append(f"alternative {i}: {outcome}: {_first(message)}")
    if verdict.wrong < MIN_WRONG or verdict.alternatives < MIN_ALTERNATIVES:
        verdict.problems.append(f"needs >= {MIN_WRONG} wrong answers and >= {MIN_ALTERNATIVES} alternative "
                                f"in {cases_dir / (name + '.py')}")
    verdict.seconds = time.monotonic() - started
    return verdict


def _first(message: str, width: int = 240) -> str:
    return " ".join(message.split())[:width]


@contextlib.contextmanager
def shared_servers(names: list[str]) -> Iterator[dict[bool, Any]]:
    """Two servers at most, one untraced and one traced, each with the models its exercises declare.

    Checkers that need more (their own repository, a C backend) start their own, as for a learner.
    """
    with contextlib.ExitStack() as stack:
        servers: dict[bool, Any] = {}
        for traced in (False, True):
            models = sorted({m for n in names if get(n).traced == traced for m in get(n).models})
            if models:
                servers[traced] = stack.enter_context(started_for(Exercise("audit", "", "", tuple(models),
                                                                           lambda a, s: "", traced)))
        yield servers


def _audit_group(names: list[str], done: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """``names`` in order on shared servers of their own; ``done`` hears each verdict as it is known."""
    verdicts = []
    with shared_servers(names) as servers:
        for name in names:
            ex = get(name)
            verdicts.append(audit_one(name, servers.get(ex.traced) if ex.models else None))
            if done is not None:
                done(verdicts[-1])
    return verdicts


def _emit(verdict: Verdict, emit: Callable[[str], None]) -> None:
    emit(verdict.line())
    for problem in verdict.problems:
        emit(f"  {problem}")


def audit(names: list[str] | None = None, emit: Callable[[str], None] = print, jobs: int = 1) -> list[Verdict]:
    """Audit ``names`` (every registered exercise by default); print one line each, in name order.

    ``jobs`` > 1 splits the exercises among that many worker processes (spawned: no gRPC state is
    forked), each with its own servers on free ports; their lines are printed when all are done, in
    the same order as a single run's. Most checkers wait on servers starting and loading, which is
    why two workers on two cores finish sooner.
    """
    names = names or sorted(EXERCISES)
    if jobs <= 1 or len(names) <= 1:
        return _audit_group(names, lambda verdict: _emit(verdict, emit))
    groups = [names[i::jobs] for i in range(jobs)]
    with concurrent.futures.ProcessPoolExecutor(len(groups), mp_context=multiprocessing.get_context("spawn")) as pool:
        done = [v for part in pool.map(_audit_group, groups) for v in part]
    verdicts = sorted(done, key=lambda v: names.index(v.name))
    for verdict in verdicts:
        _emit(verdict, emit)
    return verdicts
