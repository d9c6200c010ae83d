"""Every embedded tritonserver runs with its frees held back a moment: the workaround for a write
after free in Triton 2.51's trace release.

The defect: ``TraceManager::TraceRelease`` (server
[src/tracer.cc:737-753](https://github.com/triton-inference-server/server/blob/r24.10/src/tracer.cc#L737-L753))
locks the mutex inside a Trace, may free that Trace (``delete ts`` drops the last reference, :749),
and then unlocks the freed mutex: a write into freed memory. Measured here with the check
below: in 596 of 720 traced gRPC requests, always bytes 16-28 of a 280-byte block (the mutex's
``__lock``, ``__owner``, ``__nusers``): the gRPC front end mostly drops its own reference first, when
it recycles the call's state (src/grpc/infer_handler.h:1117-1124), so TraceRelease holds the last
one. Harmless while nobody else has that memory; when another thread was handed it in between, its
data is corrupted. Stop 43's CI lost a traced server in the middle of a burst to heap corruption
(glibc: "corrupted size vs. prev_size"); this is the only write after free the check finds in a
server's process, and only with tracing (``tests/reliability/test_trace_release_write.py``). Fixed
upstream by server 25baa7b (#8144, "Fix segfaults in tracing mode after long run", first in v2.57.0).

The workaround, ``c_backends/preload/free_quarantine.c``, is preloaded (``LD_PRELOAD``) into every
server ``local.py`` starts: each thread's last 16 frees wait in a ring before they reach the
allocator, and TraceRelease frees only two more blocks between the Trace and the unlock, so the
unlock always writes into memory no other thread can have been given. Why by hand: no maintained tool
does this to a binary we cannot rebuild (AddressSanitizer needs the server recompiled; another
allocator, jemalloc or tcmalloc, only changes the odds that the memory was handed on). Python stubs
inherit the variable: harmless (16 blocks per thread).

``LAB_FREE_QUARANTINE_CHECK=1`` in the server's environment makes the library compare each held block
with a copy taken when it was freed, and log a line per write after free; :func:`writes_after_free`
reads them (``tests/reliability/test_trace_release_write.py`` pins the defect with it). The NGC
container (``docker.py``) is not covered: its 24.10 server has the same defect.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import BackendBuildError
from lab_backends.paths import BUILD_DIR, PROJECT_ROOT
from lab_backends.server import cbackend

SOURCE = PROJECT_ROOT / "c_backends" / "preload" / "free_quarantine.c"
LIBRARY = BUILD_DIR / "preload" / "libfree_quarantine.so"
#: Set (to anything) in the server's environment: log every write into a held block.
CHECK_VARIABLE = "LAB_FREE_QUARANTINE_CHECK"
_REPORT = re.compile(r"free_quarantine: pid (\d+): a freed (\d+)-byte block was written after free, "
                     r"at bytes (\d+)-(\d+)")


@dataclass(frozen=True)
class WriteAfterFree:
    """One report of the check: ``pid`` wrote bytes ``first``..``last`` of a freed ``block_bytes`` block."""

    pid: int
    block_bytes: int
    first: int
    last: int


def is_stale(library: Path = LIBRARY) -> bool:
    """True when the library is missing or older than its source."""
    return cbackend.outdated(library, [SOURCE])


def build(library: Path = LIBRARY, *, force: bool = False) -> Path:
    """Compile the preload library when it is missing or stale (set-up does; so does a server start).

    Built beside it and renamed into place (``cbackend.built_in_place``): test workers starting servers
    at once may all build it, and none is handed half a file.
    """
    if not force and not is_stale(library):
        return library
    if not os.access(library.parent if library.parent.exists() else library.parent.parent, os.W_OK):
        # A class learner's server: build/ is the instructor's. A stale library is still the workaround.
        if library.exists():
            return library
        raise BackendBuildError(f"{library} is missing and {library.parent} is not writable here: the server "
                                "needs it (a workaround for Triton 2.51's trace release); the project's owner "
                                "runs `lab-backends setup` once")
    with cbackend.built_in_place(library) as tmp:
        command = [cbackend.find_compiler(), *cbackend.CFLAGS, "-shared", "-o", str(tmp), str(SOURCE), "-ldl",
                   "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise BackendBuildError(
                f"building {library.name} from {SOURCE} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}\n  how to fix: the server needs it (a "
                f"workaround for Triton 2.51's trace release); run `lab-backends setup` and read the error"
            )
    return library


def preloaded(env: dict[str, str], library: Path = LIBRARY) -> dict[str, str]:
    """``env`` with the library first in ``LD_PRELOAD`` (built first if it needs to be)."""
    path = str(build(library))
    others = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != path]
    return {**env, "LD_PRELOAD": ":".join([path, *others])}


def writes_after_free(log_text: str) -> list[WriteAfterFree]:
    """The check's reports in a server log, in order."""
    return [WriteAfterFree(*(int(g) for g in m.groups())) for m in _REPORT.finditer(log_text)]
