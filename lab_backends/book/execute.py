"""Execute every lesson at full size for ``make book`` (the test run uses nbval's outputs instead).

Each notebook runs top to bottom in its own kernel, from ``notebooks/`` (as in JupyterLab), with
``LAB_FAST`` off and ``LAB_PATIENT=1`` so the demonstrations that wait out a real clock run too.
A failing cell does not stop the book: the error is kept in the page, counted in the notebook's
``lab_book`` metadata, and reported at the end with a non-zero exit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from lab_backends.book import executed_dir, lessons
from lab_backends.paths import NOTEBOOK_DIR

#: Per-cell limit: the longest full-size cells (loads, the one-minute summary window) fit well inside.
CELL_TIMEOUT_S = 600


def execute(path: Path, target_dir: Path) -> list[int]:
    """Run one notebook and write the executed copy; the numbers of the code cells that failed."""
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()
    code = [c for c in book.cells if c.cell_type == "code"]
    failed = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    book.metadata["lab_book"] = {"executed_by": "make book", "lab_fast": os.environ.get("LAB_FAST", "0") == "1",
                                 "cells_run": len(code), "code_cells": len(code), "failed_cells": failed}
    target_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(book, target_dir / path.name)
    return failed


def execute_all(target_dir: Path | None = None) -> dict[str, list[int]]:
    """Every lesson in turn; the failed cells per notebook (empty lists when all went well)."""
    os.environ["LAB_FAST"] = os.environ.get("LAB_FAST", "0")
    os.environ.setdefault("LAB_PATIENT", "1")
    results = {}
    for path in lessons():
        start = time.monotonic()
        results[path.name] = execute(path, target_dir or executed_dir())
        status = f"FAILED cells {results[path.name]}" if results[path.name] else "ok"
        print(f"{path.name}: {status} ({time.monotonic() - start:.0f} s)", flush=True)
    return results
