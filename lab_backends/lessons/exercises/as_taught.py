"""The audit's second path: each answer put where the notebook tells the learner to put it, and judged
by the notebook's own check cell, its source read from the ``.ipynb``, in a fresh process.

Why: the direct path (``check(name, answer)`` from outside) once accepted every C answer while the
learner, editing ``exercises/clip.c`` in place as notebook 09 says, was told "not attempted" for a
correct file: the checker compared the file with itself. Only running the learner's path finds that.

How an answer is put in place, per the shape of the check cell's answer argument:

* **a path** (``exercises.check("clip_backend", "exercises/clip.c")``): a scratch copy of the
  notebooks folder is handed out (:func:`lab_backends.lessons.handout.hand_out`), the answer's text is
  written over the file the path names, *in place*, and the cell runs with the scratch folder as its
  working directory, as Jupyter runs a notebook in its own folder;
* **a name** (``exercises.check("kserve_json_body", request_body, server)``): the name is bound to the
  answer, as the learner's answer cell binds it; when the check cell itself assigns the name
  (``my_batcher = None  # your override``), that assignment is the line the learner edits, so it is
  replaced by the answer.

The skeleton is put nowhere: the cells run as shipped (the answer cell as the notebook has it, the C
file as set-up hands it out). Only what the check cell needs runs, not the notebook: the import
statements of the cells above it, ``server`` bound to the audit's server (reached by its URLs, as a
notebook reaches a shared server), and for any other name the cell uses, the nearest cell above that
binds it (and, recursively, what that cell needs). The verdict is read from what the cell printed:
the line the learner reads.

Run as ``python -m lab_backends.lessons.exercises.as_taught NAME ...`` by :func:`in_fresh_process`;
it prints one ``AS-TAUGHT {json}`` line per answer.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.lessons.exercises.answers import (
    Answer,
    Judged,
    answers_of,
    check_call,
    judged_despite_crashes,
    notebook_cells,
)
from lab_backends.lessons.exercises.registry import get, load_module
from lab_backends.lessons.handout import hand_out
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

MARK = "AS-TAUGHT "
#: A bound on one exercise's as-taught run (every answer): the slowest checker takes ~60 s per answer.
TIMEOUT_S = 1200.0
#: How deep the search for a name's binding cell may go (a cell needing a cell needing a cell).
MAX_DEPTH = 4


@dataclass(frozen=True)
class CheckCell:
    """The notebook's check cell for one exercise, and the cells above it."""

    notebook: Path
    index: int
    source: str
    statement: int
    answer: ast.expr
    above: tuple[str, ...]

    @property
    def answer_name(self) -> str | None:
        return self.answer.id if isinstance(self.answer, ast.Name) else None


def find_check_cell(name: str, notebooks_dir: Path) -> CheckCell:
    ex = get(name)
    path = notebooks_dir / f"{ex.notebook}.ipynb"
    sources = notebook_cells(path)
    for index, source in enumerate(sources):
        call = check_call(source, name)
        if call is not None:
            return CheckCell(path, index, source, call[0], call[1], tuple(sources[:index]))
    raise ExerciseError(f"{path.name} never calls exercises.check({name!r}, ...)")


def _parse(source: str) -> ast.Module | None:
    """A cell as Python; its IPython lines (``%matplotlib inline``, ``!ls``) become ``pass``: they set nothing up
    that a check cell needs, and outside IPython they would not run."""
    lines = ["pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _top_level_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names loaded, names bound) by the cell's own statements, function and lambda bodies left out."""
    loaded, bound = set(), set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return loaded, bound


def _needs(tree: ast.Module, namespace: dict[str, Any]) -> set[str]:
    loaded, bound = _top_level_names(tree)
    return {n for n in loaded - bound if n not in namespace and not hasattr(builtins, n)}


def _imports(cells: tuple[str, ...]) -> ast.Module:
    """Every top-level import statement of ``cells``: what a notebook's first cell sets up, without its servers."""
    body: list[ast.stmt] = []
    for source in cells:
        tree = _parse(source)
        body += [s for s in (tree.body if tree else []) if isinstance(s, (ast.Import, ast.ImportFrom))]
    return ast.Module(body=body, type_ignores=[])


def _provide(names: set[str], cell: CheckCell, namespace: dict[str, Any], depth: int = 0) -> None:
    """Run, for each of ``names``, the nearest cell above the check cell that binds it (and what it needs)."""
    for name in sorted(names):
        if name in namespace:
            continue
        for source in reversed(cell.above):
            tree = _parse(source)
            if tree is None or name not in _top_level_names(tree)[1]:
                continue
            if depth >= MAX_DEPTH:
                raise ExerciseError(f"{cell.notebook.name}: {name!r} needs cells {MAX_DEPTH} deep; "
                                    "the audit stops there")
            _provide(_needs(tree, namespace), cell, namespace, depth + 1)
            exec(compile(tree, f"{cell.notebook.name} (the cell binding {name})", "exec"), namespace)
            break
        else:
            raise ExerciseError(f"{cell.notebook.name}: the check cell uses {name!r}, which no cell above binds")


def _without_assignment(tree: ast.Module, name: str) -> ast.Module:
    """The check cell with its own ``name = ...`` removed: the line the learner replaces by their answer."""
    def assigns(s: ast.stmt) -> bool:
        targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, ast.AnnAssign) else []
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return ast.Module(body=[s for s in tree.body if not assigns(s)], type_ignores=[])


def _verdict(name: str, printed: str) -> tuple[str, str]:
    """(outcome, message) from the line :func:`~.registry.check` printed for ``name``."""
    for line in printed.splitlines():
        if line.startswith(f"✓ {name}:"):
            return "pass", line
        if line.startswith(f"✗ {name}:"):
            return "refused", printed[printed.index(line):]
        if line.startswith(f"'{name}' is not attempted yet"):
            return "not-attempted", line
    return "error", f"the check cell printed no verdict for {name}: {printed[-300:]!r}"


def judge_one(cell: CheckCell, answer: Answer, workdir: Path, server: RunningServer | None) -> Judged:
    """Put ``answer`` where the notebook says, run the check cell in a fresh namespace, read its verdict."""
    started = time.monotonic()
    judged = _judge_one(cell, answer, workdir, server)
    return replace(judged, seconds=round(time.monotonic() - started, 1))


def _judge_one(cell: CheckCell, answer: Answer, workdir: Path, server: RunningServer | None) -> Judged:
    name = answer.exercise
    tree = _parse(cell.source)
    assert tree is not None  # check_call parsed it
    namespace: dict[str, Any] = {"__name__": "__main__"}
    out = io.StringIO()
    previous = Path.cwd()
    where = f"{cell.notebook.name} code cell {cell.index}, " + (
        "as shipped" if answer.kind == "skeleton" else f"{cell.answer_name} bound" if cell.answer_name else "")
    try:
        os.chdir(workdir)
        with contextlib.redirect_stdout(out):
            exec(compile(_imports(cell.above), f"{cell.notebook.name} (imports)", "exec"), namespace)
            if server is not None:
                namespace["server"] = server
            if answer.kind != "skeleton" and cell.answer_name:
                namespace[cell.answer_name] = answer.value
                tree = _without_assignment(tree, cell.answer_name)
            _provide(_needs(tree, namespace), cell, namespace)
            if answer.kind != "skeleton" and cell.answer_name is None:
                where += f"{_write_in_place(cell, answer, namespace)} written in place"
            exec(compile(tree, f"{cell.notebook.name} (check cell {cell.index})", "exec"), namespace)
    except Exception as exc:  # noqa: BLE001 - a crash of the learner's path is the finding
        return Judged(answer.label, "error", f"{type(exc).__name__}: {exc}", where)
    finally:
        os.chdir(previous)
    return Judged(answer.label, *_verdict(name, out.getvalue()), where)


def _write_in_place(cell: CheckCell, answer: Answer, namespace: dict[str, Any]) -> Path:
    """Write a file answer over the file the check cell names, relative to the notebook's folder; that path."""
    target = Path(eval(compile(ast.Expression(cell.answer), cell.notebook.name, "eval"), namespace))
    if target.is_absolute() or not target.exists():
        raise ExerciseError(f"{cell.notebook.name}: the check cell names {target}, not a handed-out file next to "
                            "the notebook: the learner cannot edit it in place")
    target.write_text(Path(answer.value).read_text())
    return target


def judge_all(name: str, cases_dir: Path, notebooks_dir: Path, server: RunningServer | None) -> list[Judged]:
    """Every answer of ``name``, each in place in a freshly handed-out copy of the notebooks folder."""
    cell = find_check_cell(name, notebooks_dir)
    with contextlib.redirect_stdout(io.StringIO()):  # the answer cells may print the task
        answers, _, _ = answers_of(name, cases_dir, notebooks_dir)
    return [judged_despite_crashes(functools.partial(_judge_in_a_fresh_copy, cell, answer, server))
            for answer in answers]


def _judge_in_a_fresh_copy(cell: CheckCell, answer: Answer, server: RunningServer | None) -> Judged:
    with tempfile.TemporaryDirectory(prefix=f"as-taught-{answer.exercise}-") as tmp:
        workdir = Path(tmp) / "notebooks"
        hand_out(workdir)
        return judge_one(cell, answer, workdir, server)


def server_environment(server: RunningServer | None) -> dict[str, str]:
    """What lets a fresh process reach ``server`` as a notebook reaches a shared one (``TRITON_URL``...)."""
    if server is None:
        return {}
    env = {"TRITON_URL": f"http://{server.http_url}", "TRITON_GRPC_URL": server.grpc_url,
           "TRITON_METRICS_URL": server.metrics_url, "TRITON_ADMIN_KEY": server.admin_key}
    if server.trace_file is not None:
        env["TRITON_TRACE_FILE"] = str(server.trace_file)
    return env


def in_fresh_process(name: str, cases_dir: Path, notebooks_dir: Path, server: RunningServer | None,
                     plugin: Path | None = None) -> list[Judged]:
    """:func:`judge_all` in a new Python process (``plugin``: a file registering extra exercises, for tests)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")} | server_environment(server)
    command = [sys.executable, "-m", __name__, name, "--cases-dir", str(cases_dir),
               "--notebooks-dir", str(notebooks_dir)]
    if plugin is not None:
        command += ["--plugin", str(plugin)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ExerciseError(f"the as-taught run of {name} took over {TIMEOUT_S:.0f} s") from exc
    judged = [Judged(**json.loads(line[len(MARK):])) for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not judged:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ExerciseError(f"the as-taught run of {name} failed (exit {done.returncode}): {' | '.join(tail)}")
    return judged


def _attached() -> RunningServer | None:
    """The audit's server, reached through the environment :func:`server_environment` set; None without one."""
    if not os.environ.get("TRITON_URL"):
        return None
    trace = os.environ.get("TRITON_TRACE_FILE")
    return TritonServer(target="remote", trace_file=Path(trace) if trace else None).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--cases-dir", type=Path, required=True)
    parser.add_argument("--notebooks-dir", type=Path, required=True)
    parser.add_argument("--plugin", type=Path)
    args = parser.parse_args(argv)
    if args.plugin:
        load_module(args.plugin, "as_taught_plugin")
    try:
        judged = judge_all(args.name, args.cases_dir, args.notebooks_dir, _attached())
    except LabBackendsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for item in judged:
        print(MARK + json.dumps(asdict(item)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
