"""gcc's AddressSanitizer for a C backend served by an embedded tritonserver: build flags, the server's
environment, and the report read back from the server's log.

Why: a learner's C answer that writes past a buffer, uses memory after freeing it or frees it twice
may corrupt the heap without crashing at once. Measured here (notebook 09c, a gather that copies a
request of 5 rows into a batch tensor sized for 1): glibc noticed later, logged ``malloc(): invalid
size (unsorted)`` and Triton's handler ``Signal (6) received.``, and the server then sat alive and
idle (its handler hung on the corrupted heap), so the fault was never named and a client without a
deadline waited for ever. With the backend built with ``-fsanitize=address`` and the runtime preloaded
into the server, the first bad write stops the server with a report that names the access
(``WRITE of size 1280``), the kind (``heap-buffer-overflow``) and the line of the learner's file.

Why AddressSanitizer and not valgrind: ASan checks only the code built with it (the learner's
backend, plus every ``memcpy``/``free`` through its interceptors) at about 2x, while valgrind would run
all of tritonserver and TensorFlow under emulation (tens of times slower: a load of several minutes on
these 2 cores). The server itself is not rebuilt, so its own allocations are checked only through the
interceptors; that is where a backend's faults land.

The runtime must come first in ``LD_PRELOAD`` (tritonserver is not linked with it), so the server runs
without the free-quarantine preload (:mod:`lab_backends.server.free_quarantine`); ASan's own quarantine
holds freed blocks back the same way. Its quarantine is kept small (:data:`QUARANTINE_MB`): a checked
server's memory stays near a plain one's. (09c's leak probe counts the backend's blocks instead of reading
the RSS: ``c_backends/checks/block_census.c``.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import BackendBuildError

#: Flags added to the backend's build: instrumented accesses, frames with file and line in the report.
COMPILE_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")
#: Freed memory ASan holds back to catch a use after free; small, see the module docstring.
QUARANTINE_MB = 16
#: ``halt_on_error``: the first fault ends the server (a check's verdict names one fault, the first).
#: ``detect_leaks=0``: Triton and TensorFlow keep memory at exit on purpose; 09c counts a backend's blocks instead.
#: ``allow_user_segv_handler``: Triton installs its own, which must not hide ASan's report.
OPTIONS = {
    "halt_on_error": "1",
    "detect_leaks": "0",
    "quarantine_size_mb": str(QUARANTINE_MB),
    "allow_user_segv_handler": "0",
    "print_summary": "1",
    "color": "never",
}

_HEADER = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_ACCESS = re.compile(r"^(READ|WRITE) of size (\d+)", re.M)
_REGION = re.compile(r"is located (\d+) bytes (?:to the )?(right|left|after|before|inside) of (\d+)-byte region")
#: Where the report goes on to say where the block was allocated or freed (other stacks).
_SECOND_PART = re.compile(r"^.*(?:is located|freed by thread|allocated by thread|previously allocated).*$", re.M)
_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ in (\S+) (\S+?):(\d+)(?::\d+)?\s*$", re.M)
#: The attempted free of a double free or a bad free has no access line; the kind says it.
_WHAT = {
    "heap-buffer-overflow": "an access past the end (or before the start) of a heap block",
    "heap-use-after-free": "a use of memory after it was freed",
    "double-free": "a block freed twice",
    "attempting double-free": "a block freed twice",
    "stack-buffer-overflow": "an access past a local array",
    "global-buffer-overflow": "an access past a global array",
    "SEGV": "a read or write of an address nothing was allocated at",
    "bad-free": "a free of memory that malloc never returned",
    "alloc-dealloc-mismatch": "memory released by another family of functions than allocated it",
}


@dataclass(frozen=True)
class Report:
    """What ASan said about the first fault: its kind, the access, and the frame in the learner's file."""

    kind: str
    access: str            #: "WRITE of size 1280", or "" for a bad free
    function: str          #: the innermost function of the learner's file on the faulting stack, or ""
    line: str              #: "tf_gather_scatter.c:593", or ""
    region: str = ""       #: "0 bytes after a 256-byte block", or ""
    freed_at: str = ""     #: where the learner's file freed the block first ("scatter() at tf.c:80"), or ""

    def sentence(self) -> str:
        """One line: ``heap-buffer-overflow (WRITE of size 1280, an access past ...) in gather(), tf.c:600``."""
        what = _WHAT.get(self.kind, self.kind)
        where = f" in {self.function}() at {self.line}" if self.line else ""
        access = f"{self.access}: " if self.access else ""
        region = f", {self.region}" if self.region else ""
        freed = f", freed first in {self.freed_at}" if self.freed_at else ""
        return f"AddressSanitizer found a {self.kind} ({access}{what}{region}){where}{freed}"


def runtime() -> Path:
    """gcc's ASan runtime (``libasan.so``), which the server must preload."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BackendBuildError("gcc is missing: the C exercises are built and checked with it (apt-get install gcc)")
    found = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
    path = Path(found.stdout.strip())
    if found.returncode != 0 or not path.is_absolute() or not path.exists():
        raise BackendBuildError("gcc's AddressSanitizer runtime (libasan.so) is missing: install it "
                                "(Debian: apt-get install libasan8) or gcc's full toolchain")
    return path.resolve()


def environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the ASan runtime first in ``LD_PRELOAD`` and :data:`OPTIONS` in ``ASAN_OPTIONS``."""
    library = str(runtime())
    others = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != library]
    options = ":".join(f"{k}={v}" for k, v in OPTIONS.items())
    return {**env, "LD_PRELOAD": ":".join([library, *others]), "ASAN_OPTIONS": options}


def report(log: str, source_name: str | tuple[str, ...]) -> Report | None:
    """The first ASan report in ``log``, its frame located in the file named ``source_name`` (or in
    a header it includes, when no frame is in that file), else ``None``.

    ``source_name`` may name several files, the learner's first, then the rest of the backend built
    with it: the faulting frame is looked for in each in turn. When it is not in the learner's file
    (Execute deleting a tensor the learner's scatter already deleted), the stack that freed the block
    first is searched for the learner's file too (``freed_at``)."""
    names = (source_name,) if isinstance(source_name, str) else tuple(source_name)
    header = _HEADER.search(log)
    if header is None:
        return None
    # A double free and a bad free both begin "attempting ..."; the SUMMARY line names them so.
    head = log[header.start():header.start() + 200]
    kind = ("double-free" if "attempting double-free" in head else
            "bad-free" if "attempting free on address which was not malloc()-ed" in head else header.group(1))
    body = log[header.start():]
    end = body.find("SUMMARY: AddressSanitizer")
    body = body if end < 0 else body[:end]
    access = _ACCESS.search(body)
    parts = _SECOND_PART.split(body, maxsplit=1)  # the faulting stack, then where the block came from
    frames = _frames(parts[0])
    ours = next(([f for f in frames if f[1] == n] for n in names if any(f[1] == n for f in frames)), [])
    ours = ours or [f for f in frames if f[1].endswith(".h")]
    function, line = (ours[0][0], f"{ours[0][1]}:{ours[0][2]}") if ours else ("", "")
    freed_at = ""
    freed = re.search(r"^.*freed by thread.*$", body, re.M)
    if ours and ours[0][1] != names[0] and freed:
        first = [f for f in _frames(_SECOND_PART.split(body[freed.end():], maxsplit=1)[0]) if f[1] == names[0]]
        freed_at = f"{first[0][0]}() at {first[0][1]}:{first[0][2]}" if first else ""
    located = _REGION.search(body)
    region = ""
    if located:
        side = {"right": "after", "left": "before"}.get(located.group(2), located.group(2))
        region = f"{located.group(1)} bytes {side} a {located.group(3)}-byte block"
    return Report(kind, f"{access.group(1)} of size {access.group(2)}" if access else "", function, line, region,
                  freed_at)


def _frames(stack: str) -> list[tuple[str, str, str]]:
    """(function, file name, line) of each frame of one stack of a report."""
    return [(m.group(1), Path(m.group(2)).name, m.group(3)) for m in _FRAME.finditer(stack)]
