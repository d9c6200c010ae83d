"""What went wrong inside a throw-away server that serves a learner's C backend, in one sentence.

A C answer runs inside tritonserver, so its faults are the server's: the checkers of notebooks 09 and
09c serve it on a server of their own, built with AddressSanitizer (:mod:`lab_backends.server.sanitizer`),
and every request they send has a deadline. When a request fails or gets no answer, :func:`fault`
says why, from the server's log and its exit, in this order:

1. ASan's report: the kind of fault, the access and the line of the learner's file;
2. a crash: the signal, and the log's own words (:func:`lab_backends.server.crash.log_cause`);
3. a server still alive whose log shows glibc's heap check (``malloc(): invalid size (unsorted)``)
   or Triton's ``Signal (N) received.``: its signal handler hangs on the corrupted heap (measured
   here, platform notes), so it will never answer; the checker's ``with TritonServer`` then stops it
   by PID (SIGTERM, then SIGKILL after the exit timeout: :func:`lab_backends.server.processes.stop_group`).

``None`` means the server looks healthy: the failure was the answer's own error message, or a hang
inside Execute without any fault (a lock never released), which the caller names from its deadline.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, Iterator

from lab_backends.errors import ExerciseError
from lab_backends.server import crash, sanitizer

#: glibc's own words when its heap checks fail (malloc/malloc.c's malloc_printerr messages).
GLIBC_HEAP = re.compile(
    r"^(?:malloc\(\)|free\(\)|realloc\(\)|malloc_consolidate\(\)|munmap_chunk\(\)|double free or corruption"
    r"|corrupted size vs\. prev_size|corrupted double-linked list)[^\n]*$", re.M)
_SIGNAL = re.compile(r"^Signal \((\d+)\) received\.", re.M)
#: Every request a C checker sends has this deadline (gRPC ``client_timeout``): its requests take
#: milliseconds, under AddressSanitizer too; a server that has not answered in this time never will.
REQUEST_DEADLINE_S = 10.0
#: How long a dying server may take to finish its report and exit (ASan symbolizes every frame first: 1-3 s
#: measured here); one that has not exited by then is stuck in its handler, and is named so.
SETTLE_S = 10.0


def _settle(server: Any, within_s: float) -> str:
    """The log once a server that has begun to die (an ASan report, a fatal signal) has exited or
    ``within_s`` passed; at once when nothing in the log says it is dying."""
    deadline = time.monotonic() + within_s
    while True:
        log = server.log_text()
        dying = "ERROR: AddressSanitizer" in log or _SIGNAL.search(log) or GLIBC_HEAP.search(log)
        if not dying or crash.crashed(server) is not None or time.monotonic() >= deadline:
            return log
        time.sleep(0.1)


def fault(server: Any, source_name: str | tuple[str, ...], within_s: float = SETTLE_S) -> str | None:
    """One sentence on what went wrong in ``server`` (see the module docstring), or ``None``.

    ``source_name``: the file name of the learner's C source, whose line ASan's report is searched for
    (or several: the learner's, then the rest of the backend built with it; see sanitizer.report).
    """
    log = _settle(server, within_s)
    found = sanitizer.report(log, source_name)
    if found is not None:
        return found.sentence()
    heap = GLIBC_HEAP.findall(log)
    glibc = f'glibc found the heap corrupted ("{heap[-1].strip()}")' if heap else ""
    code = crash.crashed(server)
    if code is not None:
        cause = crash.log_cause(log, code) or crash.describe_exit(code)
        return f"tritonserver died ({cause}{', after ' + glibc if glibc else ''})"
    signals = _SIGNAL.findall(log)
    if glibc or signals:
        said = glibc or f'Triton caught signal {signals[-1]} ("Signal ({signals[-1]}) received.")'
        return f"tritonserver stopped answering: {said}, and its signal handler hangs on the damaged heap"
    return None


@contextlib.contextmanager
def named(server: Any, source_name: str, advice: str, within_s: float = SETTLE_S) -> Iterator[None]:
    """Any failure inside the block, on a server that faulted, becomes the fault's verdict (with ``advice``):
    a request that failed because the backend crashed the server is the crash, not "request i failed"; a
    request that met its deadline on a server with no fault is "no answer" (Execute hung)."""
    try:
        yield
    except Exception as exc:
        found = fault(server, source_name, within_s)
        if found is not None:
            raise ExerciseError(f"{found}: your backend runs inside the server. {advice}") from exc
        if isinstance(exc, TimeoutError) or "DEADLINE_EXCEEDED" in str(exc):
            raise ExerciseError(
                f"a request got no answer within {REQUEST_DEADLINE_S:.0f} s, and the server shows no crash: Execute "
                "never returned or never sent a response. Every request needs one response sent (or an error) and "
                "one release, and Execute must return") from exc
        raise
