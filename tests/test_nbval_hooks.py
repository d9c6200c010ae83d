"""notebooks/conftest.py under a real nbval run: a NameError after a failed cell is a skip naming it.

Why: nbval runs every cell after a failure, and a check that only lacks the failed cell's result
used to add a second, misleading failure (``NameError: name 'expired' is not defined``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from lab_backends.paths import PROJECT_ROOT


def test_a_name_error_after_a_failed_cell_is_skipped_and_other_failures_still_fail(tmp_path: Path) -> None:
    shutil.copy(PROJECT_ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(source) for source in (
        "a = 1",
        "raise ValueError('the real fault')\nb = 2",
        "print(b)",          # NameError only because the cell above failed: skipped
        "assert a == 2",     # a failure of its own: still fails
    )]
    nbformat.write(book, tmp_path / "t.ipynb")
    env = {**os.environ, "LAB_BOOK_CAPTURE": "0"}
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-rs", "-p", "no:cacheprovider", "t.ipynb"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    tail = run.stdout.splitlines()[-1]
    assert "2 failed, 1 passed, 1 skipped" in tail, run.stdout[-2000:]
    assert "uses a name that Cell 1 (failed above) never defined" in run.stdout
