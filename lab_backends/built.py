"""What every set-up build step does around its own work: hold a file lock while it builds, tell
whether its files are newer than the code that makes them, and copy a built file into a model
folder atomically.

Why one module: the digits, character and transformer models (``digits/``, ``charlm/``, ``kvlm/``)
and ExecuTorch's export environment each need the same three things, and a server that loads a
model while set-up copies it must never read half a file. The lock is ``fcntl.flock``: set-up's
library thread and its model steps (and two set-ups at once) wait for each other instead of
building the same file twice.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (created, with its folder) for the ``with`` block."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def newer_than_code(built: Iterable[Path], code: Iterable[Path]) -> bool:
    """True when every built file exists and is at least as new as the newest source of ``code``."""
    newest = max(p.stat().st_mtime for p in code)
    return all(p.exists() and p.stat().st_mtime >= newest for p in built)


def copy_if_stale(src: Path, dst: Path) -> bool:
    """Copy the file ``src`` to ``dst`` unless ``dst`` has its size and is as new; True when copied.

    Atomic (a temporary name, then ``os.replace``): a server loading the model never reads half a file.
    """
    if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.stat().st_mtime >= src.stat().st_mtime:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    return True
