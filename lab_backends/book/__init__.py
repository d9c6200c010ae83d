"""The book: every lesson notebook executed, rendered with its outputs and plots as a static site.

Notebooks are committed without outputs (clean diffs, honest CI), so nothing can be read before a
run. Two ways to get executed copies into ``build/executed/``, then one renderer:

* ``capture``: a pytest hook that keeps what nbval already executed in ``make test`` (no second
  execution; loaded by ``notebooks/conftest.py``);
* ``execute``: ``make book`` runs every notebook at full size with nbclient (``LAB_PATIENT=1``);
* ``render``: nbconvert HTML per lesson plus the README as ``build/book/index.html``.
"""

from __future__ import annotations

import os
from pathlib import Path

from lab_backends.paths import BUILD_DIR, lesson_notebooks
from lab_backends.paths import executed_dir as executed_dir  # where executed copies go (basics: the class writes too)


def book_dir() -> Path:
    """Where the site goes (``LAB_BOOK_DIR`` overrides ``build/book``)."""
    return Path(os.environ.get("LAB_BOOK_DIR", BUILD_DIR / "book"))


def lessons() -> list[Path]:
    """Every lesson: ``notebooks/*.ipynb`` (a new notebook is picked up without listing it)."""
    return lesson_notebooks()
