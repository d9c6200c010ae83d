"""Byte-compile the environment ahead of a class (``make class``): ``python -m lab_backends.classroom.precompile``.

Why: pip installs with ``--no-compile`` (Makefile: tens of thousands of modules in torch and TensorFlow
that nobody imports), and Python compiles what a process imports on first import, caching the bytecode
next to the source. Learners run as themselves and cannot write into root's venv: nothing they import
would be cached, so every learner's server, kernel and lesson would compile its imports in memory each
time (tests/class's three learners: lesson 01 took 84 s instead of 53 s). So the class
compiles the venv once, as root, before it starts; a second run only reads the cached headers.

Why not ``python -m compileall -j 0 .venv/lib``: it exits 1 on any file that this Python cannot compile,
and the wheels ship such files on purpose (torch's ``testing/_internal/py312_intrinsics.py`` uses PEP 695
syntax, which Python 3.11 refuses: nobody can import it here anyway). Third-party files that fail are
skipped and counted; a syntax error in our own package (``lab_backends/``, installed editable, outside
the venv) fails, naming the file, the line and the error.
"""

from __future__ import annotations

import compileall
import os
import py_compile
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from lab_backends.errors import LabBackendsError
from lab_backends.paths import PROJECT_ROOT

#: Our package: every module of it must compile.
OURS = PROJECT_ROOT / "lab_backends"


class PrecompileError(LabBackendsError):
    """A module of ours does not compile: the class would fail when a learner imports it."""


@dataclass
class Compiled:
    """What one run did: how many files it checked (compiled or already cached), where, and what it skipped."""

    files: int = 0
    seconds: float = 0.0
    skipped: list[Path] = field(default_factory=list)   #: third-party files this Python cannot compile

    def summary(self) -> str:
        line = f"precompile: {self.files} Python files up to date in {self.seconds:.0f} s"
        if self.skipped:
            first = ", ".join(str(p) for p in self.skipped[:3])
            line += (f"; skipped {len(self.skipped)} third-party file(s) that Python "
                     f"{sys.version_info.major}.{sys.version_info.minor} cannot compile ({first}"
                     f"{', ...' if len(self.skipped) > 3 else ''})")
        return line


def default_roots() -> list[Path]:
    """This interpreter's site-packages (the venv's, when run by ``.venv/bin/python``), once each."""
    paths = sysconfig.get_paths()
    return sorted({Path(paths["purelib"]), Path(paths["platlib"])})


def python_files(root: Path) -> list[Path]:
    """Every ``.py`` under ``root``, symbolic links to folders not followed (compileall does the same)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(Path(folder) / name for name in sorted(files) if name.endswith(".py"))
    return found


def _compile_all(files: list[Path], workers: int) -> list[bool]:
    """compileall's own per-file step (recompiles only when the source changed), on ``workers`` processes."""
    step = partial(compileall.compile_file, quiet=2)
    if workers <= 1 or len(files) < 64:
        return [bool(step(str(f))) for f in files]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return [bool(ok) for ok in pool.map(step, map(str, files), chunksize=64)]


def _why(path: Path) -> str:
    """The compiler's own words for a file that did not compile: ``file:line: message`` (or why it could not)."""
    try:
        py_compile.compile(str(path), doraise=True)
    except py_compile.PyCompileError as err:
        exc = err.exc_value
        line = getattr(exc, "lineno", None)
        return f"{path}{f':{line}' if line else ''}: {type(exc).__name__}: {getattr(exc, 'msg', exc)}"
    except OSError as exc:  # its __pycache__ cannot be written, say
        return f"{path}: {exc}"
    return f"{path}: did not compile"


def precompile(roots: list[Path] | None = None, ours: Path = OURS, workers: int | None = None) -> Compiled:
    """Compile every ``.py`` under ``roots`` (default: site-packages) and ``ours``; raise if one of ours fails."""
    started = time.monotonic()
    theirs = [f for root in (roots if roots is not None else default_roots()) for f in python_files(root)]
    mine = python_files(ours)
    results = _compile_all(mine + theirs, workers or os.cpu_count() or 1)
    failed_mine = [f for f, ok in zip(mine, results) if not ok]
    if failed_mine:
        raise PrecompileError(f"{_why(failed_mine[0])} (fix it: learners import this package)"
                              + (f"; {len(failed_mine) - 1} more of ours fail" if len(failed_mine) > 1 else ""))
    skipped = [f for f, ok in zip(theirs, results[len(mine):]) if not ok]
    return Compiled(files=len(results) - len(skipped), seconds=time.monotonic() - started, skipped=skipped)


def main() -> int:
    try:
        print(precompile().summary(), flush=True)
    except PrecompileError as exc:
        print(f"precompile: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
