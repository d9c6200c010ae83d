"""Keep the outputs nbval produced, so that ``make test`` renders the book without running twice.

nbval executes each code cell in a real kernel and keeps the outputs on the pytest item
(``IPyNbCell.test_outputs``) only to compare them; with ``--nbval-lax`` and stripped notebooks
nothing is compared and they are thrown away. These hooks collect them per notebook and, at the
end of the session, write ``build/executed/<notebook>.ipynb``: the committed notebook with each
code cell's outputs and an execution count. ``notebooks/conftest.py`` loads them; set
``LAB_BOOK_CAPTURE=0`` to switch them off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from lab_backends.book import executed_dir

_CAPTURED: dict[Path, dict[int, list[Any]]] = {}
_FAILED: dict[Path, list[int]] = {}


def _enabled() -> bool:
    return os.environ.get("LAB_BOOK_CAPTURE", "1") != "0"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any):
    """After nbval ran a cell (passed or not), keep its outputs under the notebook's path."""
    outcome = yield
    outputs = getattr(item, "test_outputs", None)
    if not _enabled() or outputs is None or not hasattr(item, "cell_num"):
        return
    path = Path(str(item.fspath)).resolve()
    _CAPTURED.setdefault(path, {})[item.cell_num] = list(outputs)
    if outcome.excinfo is not None:
        _FAILED.setdefault(path, []).append(item.cell_num)


def write_executed(path: Path, outputs: dict[int, list[Any]], failed: list[int], target_dir: Path) -> Path:
    """The committed notebook at ``path`` with the captured outputs, written into ``target_dir``."""
    book = nbformat.read(path, as_version=4)
    count = 0
    code_cells = [c for c in book.cells if c.cell_type == "code"]
    for number, cell in enumerate(code_cells):
        if number in outputs:
            count += 1
            cell.execution_count = count
            cell.outputs = [nbformat.from_dict(o) for o in outputs[number]]
            for out in cell.outputs:
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = count
    book.metadata["lab_book"] = {
        "executed_by": "nbval (make test)",
        "lab_fast": os.environ.get("LAB_FAST", "0") == "1",
        "cells_run": len(outputs), "code_cells": len(code_cells), "failed_cells": sorted(failed),
    }
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / path.name
    nbformat.write(book, target)
    return target


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Write every notebook nbval ran in this session (a partial run writes only those)."""
    if not _enabled() or not _CAPTURED:
        return
    for path, outputs in sorted(_CAPTURED.items()):
        write_executed(path, outputs, _FAILED.get(path, []), executed_dir())
    _CAPTURED.clear()
    _FAILED.clear()
