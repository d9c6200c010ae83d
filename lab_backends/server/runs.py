"""Pruning ``build/runs/``: each local server leaves a run folder (log, traces); keep a bounded number.

Without pruning the folder grows by one directory per server started, forever (a test suite run
starts dozens). A folder is removed only when it is old (nothing written for ``min_age_s``),
beyond the ``keep`` newest, and no process runs in it (a server's working directory is its run
folder, so a live server's folder is never touched, however idle it is).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psutil

KEEP = 30
MIN_AGE_S = 3600.0


def _working_dirs() -> set[str]:
    """The working directories of the processes we can see (other users' are unreadable: skipped).

    A process that exits while we look is skipped by ``process_iter``; one we may not read (or a
    zombie) gives None.
    """
    return {p.info["cwd"] for p in psutil.process_iter(["cwd"]) if p.info["cwd"]}


def _last_write(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for item in folder.iterdir():
        try:
            times.append(item.stat().st_mtime)
        except OSError:
            continue
    return max(times)


def prune(runs_dir: str | Path, keep: int = KEEP, min_age_s: float = MIN_AGE_S, prefix: str = "triton-") -> list[Path]:
    """Remove old, unused run folders beyond the ``keep`` newest; returns what was removed."""
    runs_dir = Path(runs_dir)
    try:
        folders = [p for p in runs_dir.iterdir() if p.is_dir() and p.name.startswith(prefix)]
    except OSError:
        return []
    stamped = sorted(((_last_write(p), p) for p in folders), reverse=True)
    busy = _working_dirs()
    now = time.time()
    removed = []
    for written, folder in stamped[keep:]:
        if now - written < min_age_s or str(folder.resolve()) in busy:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
