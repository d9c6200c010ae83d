"""Noticing that a running ``tritonserver`` died, saying why, and bringing it back.

Triton 2.51 can be killed by a single malformed request (see docs/reliability.md, "upstream
defects"): deeply nested JSON overflows its stack (SIGSEGV, nothing logged), a huge JSON shape
throws ``std::bad_alloc`` (SIGABRT). Without this module a notebook's server simply vanishes and
the next call fails with "connection refused", which explains nothing. Here the next call raises
:class:`~lab_backends.errors.ServerCrashed` with the signal and the log's last meaningful lines,
and ``TritonServer.restart()`` starts the same server again (same models, same ports, so clients and URLs
that learners copied keep working).
"""

from __future__ import annotations

import re
import signal
import time
from typing import Any, Callable

from lab_backends.errors import LabBackendsError, ServerCrashed

#: Lines of a C++ stack dump ("12# 0x00007F... in /lib/...") say nothing to a learner.
_FRAME = re.compile(r"^\s*\d+# ")
_NOISE = ("CudaDriverHelper", "NVML", "DCGM", "pinned memory", "unable to create stream")
_KNOWN = {
    signal.SIGSEGV: "a segmentation fault; Triton 2.51 dies this way on deeply nested JSON (e.g. "
    "'{\"inputs\":' followed by many '[') and on shapes whose byte size overflows",
    signal.SIGABRT: "an abort; Triton 2.51 aborts on a JSON shape far larger than its data "
    "(std::bad_alloc) and on other uncaught C++ exceptions",
    signal.SIGKILL: "SIGKILL: someone killed it, or the kernel's out-of-memory killer did (see `dmesg`)",
    signal.SIGTERM: "SIGTERM from outside this process",
}


def describe_exit(returncode: int) -> str:
    """``-11`` -> "killed by signal 11 (SIGSEGV): a segmentation fault; ...", ``1`` -> "exited with code 1"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"killed by signal {-returncode}"
    why = _KNOWN.get(sig)
    return f"killed by signal {sig.value} ({sig.name})" + (f": {why}" if why else "")


def last_words(log: str, lines: int = 12) -> str:
    """The log's last meaningful lines: no stack frames, no CPU-only noise, no tables."""
    kept = [
        ln for ln in log.splitlines()
        if ln.strip() and not _FRAME.match(ln) and not ln.startswith(("|", "+")) and not any(n in ln for n in _NOISE)
    ]
    return "\n".join(kept[-lines:])


def crashed(server: Any) -> int | None:
    """The exit code of a local server that died while we still owned it, else ``None``."""
    process = getattr(server, "process", None)
    if getattr(server, "target", "") != "local" or process is None:
        return None
    return process.poll()


def crash_error(server: Any, returncode: int) -> ServerCrashed:
    tail = last_words(server.log_text())
    return ServerCrashed(
        f"tritonserver (pid {server.pid}) {describe_exit(returncode)}. It is no longer serving; "
        f"call server.restart() to start it again with the same models and ports (log: {server.log_path})",
        tail,
        returncode,
    )


def raise_if_crashed(server: Any) -> None:
    """Raise :class:`ServerCrashed` if the server we started has died on its own."""
    code = crashed(server)
    if code is not None:
        raise crash_error(server, code)


def supervise(
    server: Any,
    max_per_minute: int = 3,
    report: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    backoff_s: float = 1.0,
) -> int:
    """Keep ``server`` serving: on each crash report it, wait (doubling backoff) and restart.

    Bounded: more than ``max_per_minute`` crashes within 60 s means something keeps killing it
    (an attacker, a broken model), so supervision gives up and returns 1 instead of looping.
    Returns 0 when ``should_stop()`` says so (or a KeyboardInterrupt arrives).
    """
    crashes: list[float] = []
    failed_start: LabBackendsError | None = None
    while not should_stop():
        if failed_start is not None:
            # The restart failed: it died again before it was ready (the same attacker, a model that
            # crashes while loading), or its port was taken meanwhile. One more failure, counted
            # against the bound like a crash, so supervision neither dies with it nor loops forever.
            message, failed_start = f"the restart failed: {failed_start}", None
        else:
            code = crashed(server)
            if code is None:
                time.sleep(0.2)
                continue
            message = str(crash_error(server, code))
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < 60] + [now]
        report(message)
        if len(crashes) > max_per_minute:
            report(f"{len(crashes)} crashes within a minute: not restarting again")
            return 1
        delay = min(backoff_s * 2 ** (len(crashes) - 1), 30.0)  # calm minutes reset the backoff
        report(f"restarting in {delay:.0f} s ({len(crashes)} crash(es) in the last minute)")
        time.sleep(delay)
        try:
            server.restart()
        except LabBackendsError as exc:
            failed_start = exc
            continue
        report(f"restarted: pid {server.pid}, HTTP {server.http_url}, gRPC {server.grpc_url}")
    return 0
