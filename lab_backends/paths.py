"""Where things live in a checkout, so that no module hard-codes a path."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder that holds ``pyproject.toml``).
PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: The lessons: ``NN_topic.ipynb`` at the top of this folder (exercises/ and solutions/ below it are not).
NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"


def lesson_notebooks() -> list[Path]:
    """Every lesson notebook, in course order (a new notebook is picked up without listing it)."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


#: The default model repository served by ``TritonServer()``.
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"

#: Everything built at set-up time (backends, trained artifacts, run folders); git-ignored.
BUILD_DIR = Path(os.environ.get("LAB_BUILD_DIR", PROJECT_ROOT / "build"))

#: The backend directory handed to ``--backend-directory``: the Python backend plus C backends.
BACKEND_DIR = BUILD_DIR / "backends"

#: Per-server working folders (logs, trace files). ``LAB_RUNS_DIR`` moves them alone: a learner of a
#: class (``lab-backends class``) shares the instructor's read-only build/ but writes runs in their home.
RUNS_DIR = Path(os.environ.get("LAB_RUNS_DIR", BUILD_DIR / "runs"))

def executed_dir() -> Path:
    """Where the book's executed notebooks go (``LAB_BOOK_EXECUTED`` overrides ``build/executed``): written by
    ``book/capture.py`` in nbval's session, and by the class's sandboxed lesson run, read by ``book render``."""
    return Path(os.environ.get("LAB_BOOK_EXECUTED", BUILD_DIR / "executed"))


#: What a lesson builds for itself while it runs (notebook 09's backends and trace, 09b's strategies).
#: ``LAB_SCRATCH_DIR`` moves it alone, for the same reason as the runs: in a class, build/ is not the learner's.
SCRATCH_DIR = Path(os.environ.get("LAB_SCRATCH_DIR", BUILD_DIR))
