"""No notebook shows an exercise's reference answer above the cell that checks it.

Why: a learner reads a notebook top to bottom; an answer printed above its exercise (as 09c once
printed ``lab_tensorflow.c``'s own ``gather()`` and ``scatter()`` right above the exercise asking for
them) turns the exercise into copying. Shown after the check cell, the same code is a comparison.

What counts as the reference of an exercise (every one in the registry):

* its solution, ``notebooks/solutions/<name>.py``: the functions of that file (an ``answer``
  function and its helpers), or the ``model.py`` text an ``answer`` string holds, or, for a C
  exercise (``answer`` is a ``.c`` file), the functions of that file which the handed-out skeleton
  leaves ``TODO(exercise)``;
* for a C exercise whose skeleton is a copy of a backend of ``c_backends/`` (most of its other
  functions identical to that backend's, as ``tf_gather_scatter.c`` once was of ``lab_tensorflow.c``), the
  functions of that backend the skeleton leaves ``TODO(exercise)``;
* an ``answer`` that is a value (a config fragment, a dict) has no code: no code cell above the check
  may hold a literal equal to it.

What counts as shown, in every cell above the exercise's check cell (``exercises.check("<name>"``):

* statically, what a source-showing helper prints: ``show``/``c_source.show``/``c_source.function``,
  ``native_lesson.show_cpp``, ``pipelines.bls_source``, ``inspect.getsource``, and ``<path>.read_text()``
  printed or displayed,
  their arguments resolved from the notebook's own imports and assignments (never by running a
  cell: nothing here starts a server, builds or measures);
* the cell's own text, markdown or code (an answer pasted into the notebook).

A shown text holds a reference when it *is* that function of that file, or when at least
:data:`SAME_FRACTION` of the reference's distinctive lines (comments and blanks dropped, whitespace
squeezed, :data:`MIN_LINE` characters or more) appear in it. The tests of the test below check that
the old 09c fails, that an answer pasted into a cell fails, and that every exercise's check cell
and references were found (so the check cannot pass by finding nothing). About 3 s, no server.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import re
import subprocess
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from lab_backends.errors import LabBackendsError
from lab_backends.lessons import exercises, handout
from lab_backends.lessons.c_source import c_functions, python_functions, strip_comments

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
C_BACKENDS = ROOT / "c_backends"
NB_09C = "notebooks/09c_native_framework_backends.ipynb"
#: The last commit whose 09c printed lab_tensorflow.c's gather() and scatter() above the exercise.
BEFORE_THE_FIX = "f70f4d3103a1479047e3100b79547f9ffee6e3ba"
#: A line shorter than this (squeezed) says too little to tell whose it is ("}", "continue;", "returnNULL;").
MIN_LINE = 16
#: A shown text holding this fraction of a reference's distinctive lines shows that reference.
SAME_FRACTION = 0.5
#: A reference needs this many distinctive lines to be compared by lines at all.
MIN_LINES = 3
C_SUFFIXES = (".c", ".cc", ".h", ".cpp")


# ------------------------------------------------------------------------------------- lines
def _squeezed(code: str) -> set[str]:
    return {s for s in (re.sub(r"\s+", "", line) for line in code.splitlines()) if len(s) >= MIN_LINE}


def _python_code(text: str) -> str:
    """``text`` without its ``#`` comments (by tokens, so a ``#`` inside a string stays); as is if it
    does not tokenize (a snippet in markdown)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"(?m)\s#.*$", "", text)


def distinctive_lines(text: str, language: str) -> frozenset[str]:
    """The lines that say whose code this is: comments dropped (by ``language``: "c", "python", or
    "any" for markdown and cell text, read both ways), whitespace squeezed, short lines dropped."""
    if language == "c":
        return frozenset(_squeezed(strip_comments(text)))
    if language == "python":
        return frozenset(_squeezed(_python_code(text)))
    return frozenset(_squeezed(strip_comments(text)) | _squeezed(_python_code(text)) | _squeezed(text))


def _language(path: Path) -> str:
    return "c" if path.suffix in C_SUFFIXES else "python" if path.suffix == ".py" else "any"


# ------------------------------------------------------------------------------- references
@dataclass(frozen=True)
class Reference:
    """One body of an exercise's reference answer: where it lives and its distinctive lines."""

    exercise: str
    where: str                       # "c_backends/.../lab_tensorflow.c:gather"
    lines: frozenset[str]
    origin: tuple[Path, str] | None  # (file, function) when it is a function of a file


@dataclass
class Answers:
    """Everything an exercise's answer is: code bodies, or a plain value."""

    exercise: str
    bodies: list[Reference] = field(default_factory=list)
    value: Any = None                # a data answer (dict, list, number)
    derived_from: Path | None = None  # the c_backends source a C skeleton copies


def _rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


def _function_body(path: Path, name: str, exercise: str) -> Reference:
    found = {f.name: f for f in c_functions(path.read_text())}
    assert name in found, f"{exercise}: {_rel(path)} defines no function {name!r}, which the skeleton leaves TODO"
    return Reference(exercise, f"{_rel(path)}:{name}", distinctive_lines(found[name].text, "c"),
                     (path.resolve(), name))


def derived_backend(skeleton: Path, todo: set[str]) -> Path | None:
    """The ``c_backends/`` source the skeleton is a copy of: at least half (and 3) of the skeleton's
    functions outside the TODO ones are identical to it, whitespace aside; None when none is."""
    mine = {f.name: re.sub(r"\s+", "", f.code) for f in c_functions(skeleton.read_text()) if f.name not in todo}
    best, best_same = None, 0
    for source in sorted(p for p in C_BACKENDS.rglob("*") if p.suffix in (".c", ".cc")):
        try:
            theirs = {f.name: re.sub(r"\s+", "", f.code) for f in c_functions(source.read_text())}
        except LabBackendsError:  # a C++ file the C reader cannot follow is not a C skeleton's origin
            continue
        same = sum(1 for name, code in mine.items() if theirs.get(name) == code)
        if same > best_same:
            best, best_same = source, same
    return best if best_same >= max(3, len(mine) / 2) else None


def answers_of(name: str) -> Answers:
    """The reference bodies of exercise ``name`` (see the module's docstring)."""
    out = Answers(name)
    answer = exercises.load_solution(name)
    solution = exercises.solution_path(name)
    if isinstance(answer, Path) and answer.suffix in C_SUFFIXES:
        skeleton = handout.handout(name).shipped
        todo = {f.name for f in c_functions(skeleton.read_text()) if "TODO(exercise)" in f.text}
        assert todo, f"{name}: the skeleton {skeleton.name} marks no function TODO(exercise)"
        out.bodies += [_function_body(answer, f, name) for f in sorted(todo)]
        out.derived_from = derived_backend(skeleton, todo)
        if out.derived_from is not None:
            out.bodies += [_function_body(out.derived_from, f, name) for f in sorted(todo)]
    elif callable(answer):
        for f in python_functions(solution.read_text()):
            out.bodies.append(Reference(name, f"{_rel(solution)}:{f.name}", distinctive_lines(f.text, "python"),
                                        (solution.resolve(), f.name)))
    elif isinstance(answer, str):  # model.py code the checker installs
        out.bodies.append(Reference(name, f"{_rel(solution)}:answer", distinctive_lines(answer, "python"), None))
    else:
        out.value = answer
    return out


# ------------------------------------------------------------------------------------ shown
@dataclass(frozen=True)
class Shown:
    """What one cell shows: a helper's output (with the file and function it shows) or its own text."""

    cell: int
    what: str
    lines: frozenset[str]
    origin: tuple[Path, str] | None = None


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else "?"
        return f"{base}.{f.attr}"
    return "?"


class Resolver:
    """Evaluates a helper's arguments in a namespace built from the notebook's own imports and the
    assignments those arguments need (and only those: a cell that starts a server is never run)."""

    def __init__(self, code_cells: list[tuple[int, str]]) -> None:
        self.namespace: dict[str, Any] = {"__name__": "notebook"}
        self.assignments: dict[str, list[tuple[int, ast.expr]]] = {}
        for index, text in code_cells:
            try:
                tree = ast.parse(_without_magics(text))
            except SyntaxError:
                continue
            for stmt in tree.body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    with contextlib.suppress(Exception):
                        exec(compile(ast.Module([stmt], []), "<notebook>", "exec"), self.namespace)
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    self.assignments.setdefault(stmt.targets[0].id, []).append((index, stmt.value))

    def value(self, node: ast.expr, cell: int, depth: int = 0) -> Any:
        """``node``'s value as of ``cell`` (the last assignment of each name before or in it)."""
        if depth > 10:
            raise LookupError("assignments nest too deep")
        scope = dict(self.namespace)
        for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
            if name in scope:
                continue
            earlier = [v for i, v in self.assignments.get(name, []) if i <= cell]
            if not earlier:
                raise LookupError(f"{name!r} is neither imported nor assigned above cell {cell}")
            scope[name] = self.value(earlier[-1], cell, depth + 1)
        return eval(compile(ast.Expression(node), "<notebook>", "eval"), scope)


def _without_magics(text: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in text.splitlines())


def _captured(call: Callable[[], Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = call()
    return out.getvalue() + (result if isinstance(result, str) else getattr(result, "text", ""))


#: Files a cell may print without this test knowing their path: configurations and logs, never code.
NOT_CODE = (".pbtxt", ".json", ".txt", ".log", ".csv")


def helper_shows(resolver: Resolver, cell: int, text: str) -> list[Shown]:
    """What the source-showing helpers called in code cell ``cell`` print, resolved statically."""
    shown: list[Shown] = []
    try:
        tree = ast.parse(_without_magics(text))
    except SyntaxError:
        return shown
    # Text a cell prints or displays: print()'s arguments and the cell's last expression.
    displayed = {id(n) for call in ast.walk(tree) if isinstance(call, ast.Call) and _call_name(call) == "print"
                 for arg in call.args for n in ast.walk(arg)}
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        displayed |= {id(n) for n in ast.walk(tree.body[-1])}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        what = ast.unparse(node)
        if name in ("show", "c_source.show", "c_source.function", "native_lesson.show_cpp") and len(node.args) == 2:
            try:
                path = Path(resolver.value(node.args[0], cell))
                function = resolver.value(node.args[1], cell)
            except Exception as exc:
                raise AssertionError(f"cell {cell}: cannot tell what `{what}` shows ({exc}); make its arguments "
                                     "names assigned in the notebook, or teach tests/test_no_answer_first.py") from exc
            if path.suffix in (".cc", ".cpp"):
                from lab_backends.lessons import native_lesson
                body = _captured(lambda: native_lesson.show_cpp(path, function))
            else:
                from lab_backends.lessons import c_source
                body = c_source.function(path, function).text
            shown.append(Shown(cell, what, distinctive_lines(body, _language(path)), (path.resolve(), function)))
        elif name in ("pipelines.bls_source", "inspect.getsource"):
            try:
                body = resolver.value(node, cell)
            except Exception as exc:
                raise AssertionError(f"cell {cell}: cannot tell what `{what}` shows ({exc})") from exc
            shown.append(Shown(cell, what, distinctive_lines(body, "python")))
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "read_text" and id(node) in displayed:
            try:
                path = Path(resolver.value(node.func.value, cell))
            except Exception as exc:
                literals = [c.value for c in ast.walk(node.func.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any(lit.endswith(NOT_CODE) for lit in literals):
                    continue  # a config or log file the notebook wrote: not a source
                raise AssertionError(f"cell {cell}: cannot tell which file `{what}` reads ({exc})") from exc
            if path.is_file():
                shown.append(Shown(cell, what, distinctive_lines(path.read_text(), _language(path)),
                                   (path.resolve(), "*")))
    return shown


@dataclass(frozen=True)
class Notebook:
    path: str
    cells: list[dict]


def read_notebook(path: Path) -> Notebook:
    return Notebook(_rel(path), json.loads(path.read_text())["cells"])


def check_cell(nb: Notebook, exercise: str) -> int:
    """The index of the one code cell that calls ``exercises.check("<exercise>"``."""
    calls = re.compile(rf"""exercises\.check\(\s*["']{re.escape(exercise)}["']""")
    found = [i for i, c in enumerate(nb.cells) if c["cell_type"] == "code" and calls.search("".join(c["source"]))]
    assert len(found) == 1, f"{nb.path}: {len(found)} cells check {exercise!r}, expected exactly one"
    return found[0]


def shown_above(nb: Notebook, before: int) -> list[Shown]:
    """Everything the cells above ``before`` show: helpers' output and each cell's own text."""
    code = [(i, "".join(c["source"])) for i, c in enumerate(nb.cells) if c["cell_type"] == "code"]
    resolver = Resolver(code)
    shown: list[Shown] = []
    for i, cell in enumerate(nb.cells[:before]):
        text = "".join(cell["source"])
        shown.append(Shown(i, f"the {cell['cell_type']} cell's own text", distinctive_lines(text, "any")))
        if cell["cell_type"] == "code":
            shown += helper_shows(resolver, i, text)
    return shown


def _literals(nb: Notebook, before: int) -> list[tuple[int, Any]]:
    out = []
    for i, cell in enumerate(nb.cells[:before]):
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_without_magics("".join(cell["source"])))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Dict, ast.List)):
                with contextlib.suppress(ValueError, SyntaxError, TypeError):
                    out.append((i, ast.literal_eval(node)))
    return out


def answers_shown_first(nb: Notebook, answers: Answers) -> list[str]:
    """One line per place where a cell above ``answers.exercise``'s check cell shows its reference."""
    before = check_cell(nb, answers.exercise)
    problems = []
    for item in shown_above(nb, before):
        for ref in answers.bodies:
            same = len(ref.lines & item.lines)
            if (item.origin is not None and item.origin == ref.origin) or (
                    len(ref.lines) >= MIN_LINES and same >= SAME_FRACTION * len(ref.lines)):
                problems.append(f"{nb.path} cell {item.cell} ({item.what}) shows {ref.where}, the reference of "
                                f"{answers.exercise!r} ({same}/{len(ref.lines)} of its lines), above the check "
                                f"cell {before}")
    if answers.value is not None:
        problems += [f"{nb.path} cell {i} holds {answers.exercise!r}'s reference value {answers.value!r} above the "
                     f"check cell {before}" for i, value in _literals(nb, before) if value == answers.value]
    return problems


# ------------------------------------------------------------------------------------ tests
EXERCISE_NAMES = sorted(exercises.EXERCISES)

#: Findings of this test that a person read and kept, each (notebook, what shows it, which reference) and
#: why; matched exactly, so any other finding fails, and an entry that no longer occurs fails too (delete it).
ACCEPTED = {
    # 09 shows scale.c's 3-line ModelFinalize (get the state, free it); clip.c's TODO 2 already spells those steps.
    ("notebooks/09_backend_c_api.ipynb", "show(SCALE, 'TRITONBACKEND_ModelFinalize')",
     "c_backends/clip/clip.c:TRITONBACKEND_ModelFinalize"),
    # 09 shows scale.c's Execute, whose failed send (log the error, ErrorDelete it, never ResponseDelete the
    # response) is section 4's ownership rule; clip.c's TODO 4 (send_response, 4 lines) asks to apply that rule.
    ("notebooks/09_backend_c_api.ipynb", "show(SCALE, 'TRITONBACKEND_ModelInstanceExecute')",
     "c_backends/clip/clip.c:send_response"),
}


def _key(problem: str) -> tuple[str, str, str]:
    """(notebook, what shows it, which reference) of one line of :func:`answers_shown_first`."""
    value = re.match(r"(\S+) cell \d+ holds '\w+''s reference value (.*) above the check cell", problem)
    if value:
        return value.group(1), "a code literal", value.group(2)
    shown = re.match(r"(\S+) cell \d+ \((.*)\) shows (\S+), the reference of", problem)
    assert shown, problem
    return shown.group(1), shown.group(2), shown.group(3)


@pytest.fixture(scope="module")
def all_answers() -> dict[str, Answers]:
    return {name: answers_of(name) for name in EXERCISE_NAMES}


def test_every_exercise_has_a_reference_to_look_for(all_answers: dict[str, Answers]) -> None:
    """Not vacuous: each exercise has code bodies long enough to compare, or a value to look for."""
    assert len(all_answers) >= 10, "the registry lists the exercises: did it load?"
    for name, answers in all_answers.items():
        assert answers.value is not None or any(len(r.lines) >= MIN_LINES for r in answers.bodies), (
            f"{name}: no reference body of {MIN_LINES}+ distinctive lines and no value: nothing to look for")
    # A C exercise whose reference is the backend's own file (tf_gather_scatter: lab_tensorflow_batch.c): its
    # functions are looked for; the skeleton holds only the TODO functions, a copy of no backend.
    tf = all_answers["tf_gather_scatter"]
    assert tf.derived_from is None
    assert {r.where for r in tf.bodies} >= {"c_backends/frameworks/lab_tensorflow/lab_tensorflow_batch.c:gather",
                                            "c_backends/frameworks/lab_tensorflow/lab_tensorflow_batch.c:scatter"}


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_no_cell_shows_the_answer_before_its_check(name: str, all_answers: dict[str, Answers]) -> None:
    ex = exercises.get(name)
    nb = read_notebook(NOTEBOOKS / f"{ex.notebook}.ipynb")
    assert check_cell(nb, name) > 0
    problems = [p for p in answers_shown_first(nb, all_answers[name]) if _key(p) not in ACCEPTED]
    assert problems == [], "\n".join(problems) + (
        "\nMove what shows the answer below the check cell, or show code that is not the answer.")


def test_every_accepted_finding_still_occurs(all_answers: dict[str, Answers]) -> None:
    """An entry of ACCEPTED that matches nothing any more is stale: it would excuse a future finding."""
    found = set()
    for name in EXERCISE_NAMES:
        nb = read_notebook(NOTEBOOKS / f"{exercises.get(name).notebook}.ipynb")
        found |= {_key(p) for p in answers_shown_first(nb, all_answers[name])}
    assert ACCEPTED <= found, f"stale entries of ACCEPTED (delete them): {sorted(ACCEPTED - found)}"


def test_the_helpers_shown_are_read() -> None:
    """Not vacuous: the source-showing helpers of the notebooks resolve to the functions they print."""
    origins = set()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = read_notebook(path)
        origins |= {(item.origin[0].name, item.origin[1]) for item in shown_above(nb, len(nb.cells)) if item.origin}
    assert {("scale.c", "TRITONBACKEND_ModelInstanceExecute"), ("lab_libtorch.cc", "gather"),
            ("lab_libtorch.cc", "scatter"), ("lab_tensorflow_batch.c", "gather")} <= origins


def _09c_with(cells: list[dict]) -> Notebook:
    return Notebook(NB_09C, cells)


def _code(text: str) -> dict:
    return {"cell_type": "code", "source": text.splitlines(keepends=True), "metadata": {}, "outputs": []}


def test_the_09c_before_the_fix_fails(all_answers: dict[str, Answers]) -> None:
    """The test of the test: 09c as it was (cells 5 and 7 printing lab_tensorflow.c's gather and
    scatter above the exercise) is refused, for both functions. Those two functions are now the
    backend's file lab_tensorflow_batch.c, so the old cells are read as showing that file."""
    try:
        old = subprocess.run(["git", "show", f"{BEFORE_THE_FIX}:{NB_09C}"], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"no git history here to read {NB_09C} at {BEFORE_THE_FIX} (an export, not a clone)")
    cells = json.loads(old.replace('show(TF_SOURCE, \\"gather\\")', 'show(TF_BATCH_SOURCE, \\"gather\\")')
                       .replace('show(TF_SOURCE, \\"scatter\\")', 'show(TF_BATCH_SOURCE, \\"scatter\\")')
                       .replace('TF_SOURCE = native_backends.tensorflow_source()\\n',
                                'TF_SOURCE = native_backends.tensorflow_source()\\n'
                                'TF_BATCH_SOURCE = native_backends.tensorflow_batch_source()\\n'))["cells"]
    problems = answers_shown_first(_09c_with(cells), all_answers["tf_gather_scatter"])
    text = "\n".join(problems)
    assert "cell 5 (show(TF_BATCH_SOURCE, 'gather'))" in text and "lab_tensorflow_batch.c:gather" in text, text
    assert "cell 7 (show(TF_BATCH_SOURCE, 'scatter'))" in text and "lab_tensorflow_batch.c:scatter" in text, text


def test_answers_put_above_the_check_are_found(all_answers: dict[str, Answers]) -> None:
    """Mutants of today's notebooks: a helper showing the answer, a solution pasted into a markdown
    cell, a value answer written in a code cell: each is refused; today's notebook is not."""
    nb = read_notebook(ROOT / NB_09C)
    at = check_cell(nb, "tf_gather_scatter")
    assert answers_shown_first(nb, all_answers["tf_gather_scatter"]) == []
    shown = _09c_with(nb.cells[:at] + [_code('scatter = show(native_backends.tensorflow_batch_source(), "scatter")')]
                      + nb.cells[at:])
    assert any("lab_tensorflow_batch.c:scatter" in p
               for p in answers_shown_first(shown, all_answers["tf_gather_scatter"]))
    batch_file = ROOT / "c_backends/frameworks/lab_tensorflow/lab_tensorflow_batch.c"
    body = next(f.text for f in c_functions(batch_file.read_text()) if f.name == "gather")
    pasted = {"cell_type": "markdown", "metadata": {}, "source": [f"Hint:\n```c\n{body}\n```\n"]}
    assert any("lab_tensorflow_batch.c:gather" in p
               for p in answers_shown_first(_09c_with(nb.cells[:2] + [pasted] + nb.cells[2:]),
                                            all_answers["tf_gather_scatter"]))
    # A Python answer pasted into a code cell above its check (notebook 01's kserve_json_body).
    ex = exercises.get("kserve_json_body")
    nb01 = read_notebook(NOTEBOOKS / f"{ex.notebook}.ipynb")
    solution = exercises.solution_path("kserve_json_body").read_text()
    pasted01 = Notebook(nb01.path, [_code(solution)] + nb01.cells)
    found = answers_shown_first(pasted01, all_answers["kserve_json_body"])
    assert any("kserve_json_body.py:answer" in p for p in found), found
    # A value answer (notebook 03's tune_the_batcher) written as a literal above its check.
    value = all_answers["tune_the_batcher"]
    nb03 = read_notebook(NOTEBOOKS / f"{exercises.get('tune_the_batcher').notebook}.ipynb")
    assert value.value is not None
    written = Notebook(nb03.path, [_code(f"config = {value.value!r}")] + nb03.cells)
    assert any("reference value" in p for p in answers_shown_first(written, value))


def test_inspect_getsource_is_a_helper_too() -> None:
    """``inspect.getsource(f)`` resolves through the notebook's own names (here, a solution's function)."""
    nb = Notebook("toy", [_code("from lab_backends.lessons import exercises\n"
                                "f = exercises.load_solution('longest_queue')\n"),
                          _code("import inspect\nprint(inspect.getsource(f))")])
    shown = [s for s in shown_above(nb, 2) if s.what.startswith("inspect.getsource")]
    assert shown and any("top.loc" in line for line in shown[0].lines), shown
    assert inspect.isfunction(exercises.load_solution("longest_queue"))
