"""pytest hooks for the notebooks under nbval: keep the executed outputs for the book, and report a
failed cell once.

Not a lesson: ``make test`` runs the notebooks with nbval, and these hooks write what it executed
to ``build/executed/`` so that ``python -m lab_backends.book render`` can build the book from the
same run (see ``lab_backends/book/capture.py``).

nbval runs every cell of a notebook even after one failed, so a cell that only uses what the failed
one would have defined fails again with a ``NameError`` that hides the real fault. Such a cell is
reported as *skipped*, naming the cell that failed first; any other failure still fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from lab_backends.book.capture import pytest_runtest_call, pytest_sessionfinish  # noqa: F401

#: notebook path -> the number of its first failed cell in this session
_FIRST_FAILED: dict[str, int] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or not hasattr(item, "cell_num"):
        return
    notebook = str(item.fspath)
    first = _FIRST_FAILED.get(notebook)
    if first is None:
        _FIRST_FAILED[notebook] = item.cell_num
    elif "NameError" in str(report.longrepr):
        report.outcome = "skipped"
        report.longrepr = (notebook, item.cell_num,
                           f"Skipped: uses a name that Cell {first} (failed above) never defined; fix Cell {first} first")
