"""The notebooks as files: stored without outputs, all collected by nbval, each shaped like a lesson.

Running them is ``make test``'s second step (nbval against a real server); this file checks what
can be checked without a kernel, so that a notebook saved with outputs, or one nbval would never
run, fails CI.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lab_backends.classroom import sandboxed_lessons

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def notebooks_on_disk() -> list[Path]:
    """Every .ipynb under notebooks/, except Jupyter's hidden checkpoint copies."""
    return sorted(
        p for p in NOTEBOOK_DIR.rglob("*.ipynb")
        if not any(part.startswith(".") for part in p.relative_to(NOTEBOOK_DIR).parts)
    )


NOTEBOOKS = notebooks_on_disk()


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 3, "notebooks/ should hold the lessons; an empty run would pass silently"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    dirty = [
        i for i, cell in enumerate(book.cells)
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name} has stored outputs or execution counts in cells {dirty}; strip them with "
        f"`.venv/bin/jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_shaped_like_a_lesson(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    first, last = book.cells[0], book.cells[-1]
    if last.cell_type == "markdown" and last.source.startswith("## Further reading"):
        last = book.cells[-2]  # the links come last (tests/test_further_reading.py); Try this just before
    assert first.cell_type == "markdown" and "what you will learn" in first.source.lower(), \
        f"{path.name} must open with a 'What you will learn' markdown cell"
    assert last.cell_type == "markdown" and "try this" in last.source.lower(), \
        f"{path.name} must end with a 'Try this' markdown cell (before Further reading)"
    code = "\n".join(c.source for c in book.cells if c.cell_type == "code")
    assert "TritonServer(" in code and re.search(r"\.stop\(\)", code), \
        f"{path.name} must start its own TritonServer (or reuse TRITON_URL) and stop it"
    assert re.search(r"\bcheck\(|\bassert\b", code), f"{path.name} must assert what it teaches"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_writes_nothing_into_the_shared_build_folder(path: Path) -> None:
    """In a class, build/ is the instructor's and read-only to learners: a lesson writes what it builds under
    ``SCRATCH_DIR`` (``LAB_SCRATCH_DIR``, set per learner by the spawner), and its servers' runs under RUNS_DIR."""
    book = nbformat.read(path, as_version=4)
    uses = [i for i, cell in enumerate(book.cells) if re.search(r"\bBUILD_DIR\b|PROJECT_ROOT / \"build\"", cell.source)]
    assert not uses, f"{path.name} names build/ in cells {uses}: write under lab_backends.paths.SCRATCH_DIR instead"


def test_every_notebook_is_collected_by_nbval() -> None:
    """The same collection `make test` does: a notebook nbval skips is a notebook CI never runs."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax",
         "--nbval-sanitize-with", str(SANITIZE), "-p", "no:cacheprovider", "notebooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = {line.split("::")[0] for line in result.stdout.splitlines() if ".ipynb::" in line}
    expected = {str(p.relative_to(ROOT)) for p in NOTEBOOKS}
    assert expected == collected, f"on disk but not collected: {sorted(expected - collected)}"


def test_make_test_runs_the_notebooks_with_nbval() -> None:
    """The stage is sandboxed_lessons (as learners of a class, or beside the tests): nbval, every lesson."""
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"^\t\$\(PY\) -m lab_backends\.classroom\.sandboxed_lessons$", target, re.M), target
    flags = " ".join(sandboxed_lessons.NBVAL_FLAGS)
    assert "--nbval-lax" in flags and "nbval_sanitize.cfg" in flags and "--nbval-cell-timeout" in flags
    plain = sandboxed_lessons.plain_command([p.name for p in NOTEBOOKS])
    assert plain[-len(NOTEBOOKS):] == [str(p) for p in NOTEBOOKS]  # every lesson on disk, as the sandboxes' shares
