"""The answers the exercise audit judges, and where they come from (:mod:`.audit` judges them).

For every exercise: the **skeleton** the notebook hands out (its answer cell as shipped; for a C
exercise, the skeleton as shipped with the package, :mod:`lab_backends.lessons.handout`), the
**reference** (``notebooks/solutions/<name>.*``), and the **wrong** and **alternative** answers of
``tests/exercise_cases/<name>.py``. :func:`answers_of` lists them in one order, with one label each,
so that the direct path (:mod:`.audit`) and the learner's path (:mod:`.as_taught`, in another
process) judge the same answers and their verdicts can be compared label by label.
"""

from __future__ import annotations

import ast
import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from lab_backends.errors import ExerciseError, ServerCrashed
from lab_backends.lessons import exercises
from lab_backends.lessons.exercises.registry import Exercise, get, load_module, load_solution
from lab_backends.lessons.handout import EXERCISES_SUBDIR, SKELETONS_DIR
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.crash import crashed

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


@dataclass(frozen=True)
class Answer:
    """One answer to judge: ``kind`` is skeleton, reference, wrong or alternative; ``says`` for a wrong one."""

    exercise: str
    label: str
    kind: str
    value: Any
    says: str = ""


@dataclass(frozen=True)
class Judged:
    """What one path made of one answer: not-attempted, pass, refused, error (or missing: no such answer)."""

    label: str
    outcome: str
    message: str
    #: Where the learner's path put the answer (the file written in place, the name bound) and which cell judged it.
    where: str = ""
    #: What the server said when it crashed under an earlier try of this answer ("" when judged once).
    again: str = ""
    #: Seconds from putting the answer in to the verdict (the last try's, when a crash made it try again).
    seconds: float = 0.0


#: Tries at one answer when the server under it crashed: a crash of Triton 2.51 (docs/reliability.md) is no
#: verdict on the answer. Seen once in some 60 audits (stop 44's CI: the server closed canary_versions' load).
CRASH_TRIES = 2
CRASHED = f"{ServerCrashed.__name__}:"


def judged_despite_crashes(judge: Callable[[], Judged], server: Any = None) -> Judged:
    """``judge()``, again when the server under it crashed (:data:`CRASH_TRIES` tries in all), ``server``
    restarted first when it is ours and down; the verdict keeps the crash's words in ``again``, and the
    audit prints them. Any other outcome, a refusal or an error of the answer's own, is final at once."""
    crashes: list[str] = []
    while True:
        judged = judge()
        if not judged.message.startswith(CRASHED) or len(crashes) + 1 >= CRASH_TRIES:
            return replace(judged, again=crashes[0]) if crashes else judged
        crashes.append(judged.message)
        if server is not None and crashed(server) is not None:
            server.restart()


def notebook_cells(path: Path) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def shipped(answer: Any) -> Any:
    """A check cell's relative path to a handed-out file (``"exercises/clip.c"``) -> the skeleton as shipped.

    The file next to the notebook is the learner's copy, maybe already edited: the direct path judges
    the skeleton as the package ships it. Anything else is returned unchanged.
    """
    if isinstance(answer, (str, Path)) and not Path(answer).is_absolute():
        parts = Path(answer).parts
        if len(parts) == 2 and parts[0] == EXERCISES_SUBDIR and (SKELETONS_DIR / parts[1]).is_file():
            return SKELETONS_DIR / parts[1]
    return answer


def answers_of(name: str, cases_dir: Path = CASES_DIR,
               notebooks_dir: Path = NOTEBOOKS_DIR) -> tuple[list[Answer], list[Judged], list[str]]:
    """(the answers of ``name`` in audit order, the ones that could not be formed, problems with its cases)."""
    ex = get(name)
    answers: list[Answer] = []
    missing: list[Judged] = []
    problems: list[str] = []
    for label, make in (("skeleton", lambda: notebook_skeleton(ex, notebooks_dir)),
                        ("reference", lambda: load_solution(name))):
        try:
            answers.append(Answer(name, label, label, make()))
        except ExerciseError as exc:
            missing.append(Judged(label, "missing", str(exc)))
    try:
        cases = load_cases(name, cases_dir)
    except ExerciseError as exc:
        return answers, missing, [str(exc)]
    answers += [Answer(name, f"wrong ({w.fault})", "wrong", w.answer, w.says) for w in cases.wrong]
    answers += [Answer(name, f"alternative {i}", "alternative", a) for i, a in enumerate(cases.alternatives, 1)]
    if len(cases.wrong) < MIN_WRONG or len(cases.alternatives) < MIN_ALTERNATIVES:
        problems.append(f"needs >= {MIN_WRONG} wrong answers and >= {MIN_ALTERNATIVES} alternative "
                        f"in {cases_dir / (name + '.py')}")
    return answers, missing, problems


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
    sources = notebook_cells(path)
    for index, source in enumerate(sources):
        call = check_call(source, ex.name)
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
        return shipped(eval(compile(ast.Expression(expr), path.name, "eval"), namespace))
    raise ExerciseError(f"{path.name} never calls exercises.check({ex.name!r}, ...)")


def check_call(source: str, name: str) -> tuple[int, ast.expr] | None:
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
