"""Noticing that a running ``tritonserver`` died, saying why, and bringing it back.

Triton 2.51 can be killed by a single malformed request (see docs/reliability.md, "upstream
defects"). Without this module a notebook's server simply vanishes and the next call fails with
"connection refused", which explains nothing. Here the next call raises
:class:`~lab_backends.errors.ServerCrashed` with the signal, the log's own words about the cause
(the C++ exception's ``what():`` line, or Triton's ``Signal (N) received.``) and its last lines;
``TritonServer.restart()`` starts the same server again (same models, same ports, so clients and
URLs that learners copied keep working). The cause is quoted, never guessed from the signal: one
signal has many causes (SIGABRT: ``bad_alloc`` from a huge JSON shape, ``filesystem_error`` from
a 256-character file name in a load request, ...).
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
#: What a signal means, not which request caused it (the log says that, when it says anything).
_MEANING = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGABRT: "an abort (an uncaught C++ exception or a failed check)",
    signal.SIGKILL: "someone killed it, or the kernel's out-of-memory killer did (see `dmesg`)",
    signal.SIGTERM: "SIGTERM from outside this process",
}
#: libstdc++'s last words on an uncaught exception, and Triton's signal handler (triton_signal.cc).
_THROWN = re.compile(r"terminate called after throwing an instance of '[^']+'")
_WHAT = re.compile(r"^\s*what\(\):")
_SIGNAL_LINE = re.compile(r"^Signal \((\d+)\) received\.")
#: How far back from the log's end the cause is looked for (meaningful lines: frames are dropped).
_CAUSE_WINDOW = 60

#: The longest wait before a restart: a server that keeps being killed comes back twice a minute.
BACKOFF_CAP_S = 30.0
#: How long a server whose log says "Signal (N) received." may take to exit (its stack trace is symbolized first).
DYING_S = 30.0

#: The advice of a crash seen from Python (a notebook, a test).
API_ADVICE = "call server.restart() to start it again with the same models and ports"
#: The advice of a crash seen by ``lab-backends serve`` without ``--restart``.
SERVE_ADVICE = (
    "not restarted: `lab-backends serve --restart` restarts it after each crash on the same ports with "
    "the same key, 1 s after the first crash and twice as long after each further one within a minute "
    f"(at most {BACKOFF_CAP_S:.0f} s), and never gives up"
)


def describe_exit(returncode: int) -> str:
    """``-11`` -> "killed by signal 11 (SIGSEGV): a segmentation fault", ``1`` -> "exited with code 1"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"killed by signal {-returncode}"
    meaning = _MEANING.get(sig)
    return f"killed by signal {sig.value} ({sig.name})" + (f": {meaning}" if meaning else "")


def _meaningful(log: str) -> list[str]:
    return [
        ln for ln in log.splitlines()
        if ln.strip() and not _FRAME.match(ln) and not ln.startswith(("|", "+")) and not any(n in ln for n in _NOISE)
    ]


def _runs(line: str) -> str:
    """A 256-character file name becomes ``AAA…(256×'A')``: its length is the point, not its letters."""
    return re.sub(r"(.)\1{19,}", lambda m: f"{m.group(1) * 3}…({len(m.group(0))}×{m.group(1)!r})", line)


def last_words(log: str, lines: int = 12) -> str:
    """The log's last meaningful lines: no stack frames, no CPU-only noise, no tables."""
    return "\n".join(_runs(ln) for ln in _meaningful(log)[-lines:])


def _shorten(line: str) -> str:
    line = _runs(line.strip())
    return line if len(line) <= 240 else line[:200] + " … " + line[-30:]


def log_cause(log: str, returncode: int | None = None) -> str:
    """The log's own words about the death: the uncaught exception (type and ``what():``), else
    Triton's ``Signal (N) received.`` line; ``""`` when the log names no cause (a stack overflow
    dies before the signal handler can write)."""
    lines = _meaningful(log)[-_CAUSE_WINDOW:]
    for i in range(len(lines) - 1, -1, -1):
        if _WHAT.match(lines[i]):
            thrown = [ln for ln in lines[max(0, i - 2):i] if _THROWN.search(ln)]
            return " / ".join(_shorten(ln) for ln in [*thrown[-1:], lines[i]])
    wanted = str(-returncode) if returncode is not None and returncode < 0 else None
    signals = [ln for ln in lines if (m := _SIGNAL_LINE.match(ln)) and (wanted is None or m.group(1) == wanted)]
    return _shorten(signals[-1]) if signals else ""


def crashed(server: Any) -> int | None:
    """The exit code of a server we started that died on its own, else ``None``.

    Asked of the server (``exit_code()``, which asks its target: a local process, a docker
    container); a remote server, which we did not start, never counts as crashed here.
    """
    exit_code = getattr(server, "exit_code", None)
    return exit_code() if exit_code is not None else None


def crash_error(server: Any, returncode: int, advice: str = API_ADVICE) -> ServerCrashed:
    """``ServerCrashed`` for a server that exited with ``returncode``; ``advice`` is what to do next
    (:data:`API_ADVICE` from Python, :data:`SERVE_ADVICE` from ``serve``, ``""`` when the caller says it)."""
    log = server.log_text()
    cause = log_cause(log, returncode)
    said = (f'The log says: "{cause}".' if cause
            else "The log names no cause (its last lines are below).")
    who = f"tritonserver (pid {server.pid})" if getattr(server, "pid", None) else "tritonserver"
    return ServerCrashed(
        f"{who} {describe_exit(returncode)}. {said} It is no longer serving"
        + (f"; {advice}" if advice else "") + f" (log: {server.log_path})",
        last_words(log),
        returncode,
    )


def raise_if_crashed(server: Any) -> None:
    """Raise :class:`ServerCrashed` if the server we started has died on its own."""
    code = crashed(server)
    if code is not None:
        raise crash_error(server, code)


def raise_if_dying(server: Any, within_s: float = DYING_S) -> None:
    """Raise :class:`ServerCrashed` if the server we started has died, or is dying, on its own.

    A request the server closed without an answer is how a crash first reaches a client, often before
    the process is gone: Triton's handler for SIGSEGV and SIGABRT prints ``Signal (N) received.`` and a
    symbolized stack trace, and only then raises the signal again (server ``src/triton_signal.cc``
    L117-L125 at r24.10), while the kernel still accepts connections on its ports. So when that line
    is the log's last meaningful one (a restarted server's log goes on after an old one), the exit is
    waited for, ``within_s`` at most; otherwise nothing is waited for.
    """
    raise_if_crashed(server)
    if getattr(server, "pid", None) is None:
        return  # a remote server: not ours to watch
    said = _meaningful(server.log_text())
    if not said or not _SIGNAL_LINE.match(said[-1]):
        return
    deadline = time.monotonic() + within_s
    while crashed(server) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    raise_if_crashed(server)


def backoff_delay(recent: int, base_s: float = 1.0) -> float:
    """The wait before restart number ``recent`` within a minute: ``base_s`` doubled each time, capped.

    Shared by ``serve --restart`` (a crashed tritonserver) and the class supervisor (a dead hub or
    ``serve``): whatever keeps dying comes back every :data:`BACKOFF_CAP_S` at worst, never in a loop.
    """
    return min(base_s * 2 ** (max(recent, 1) - 1), BACKOFF_CAP_S)


def supervise(
    server: Any,
    max_per_minute: int | None = None,
    report: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    backoff_s: float = 1.0,
    tick: Callable[[], None] | None = None,
) -> int:
    """Keep ``server`` serving: on each crash report it, wait (doubling backoff) and restart.

    By default it never gives up: one request can kill Triton 2.51 (docs/reliability.md), so whoever
    can reach the server could otherwise end it, and with it a class, by crashing it a few times in a
    minute. The backoff doubles with each crash within the last minute, capped at
    :data:`BACKOFF_CAP_S`, so a server that keeps being killed costs a restart every 30 s, not a
    loop. With ``max_per_minute``, more crashes than that within 60 s make it give up and return 1.
    Returns 0 when ``should_stop()`` says so or on Ctrl-C (KeyboardInterrupt), whether it came
    while watching, waiting or restarting; the caller then stops the server. ``tick``, when given, is
    called between looks while the server runs: ``serve --restart`` passes
    :meth:`lab_backends.server.stub_health.StubWatch.tick`, which reloads a model whose Python stub died
    (tritonserver lives on then, so there is no crash to see here).
    """
    try:
        return _supervise(server, max_per_minute, report, should_stop, backoff_s, tick)
    except KeyboardInterrupt:
        return 0


def _supervise(server: Any, max_per_minute: int | None, report: Callable[[str], None], should_stop: Callable[[], bool],
               backoff_s: float, tick: Callable[[], None] | None = None) -> int:
    crashes: list[float] = []
    failed_start: LabBackendsError | None = None
    while not should_stop():
        if failed_start is not None:
            # The restart failed: it died again before it was ready (the same attacker, a model that
            # crashes while loading), or its port was taken meanwhile. One more failure, counted
            # like a crash (backoff, bound), so supervision neither dies with it nor spins.
            message, failed_start = f"the restart failed: {failed_start}", None
        else:
            code = crashed(server)
            if code is None:
                if tick is not None:
                    tick()
                time.sleep(0.2)
                continue
            message = str(crash_error(server, code, advice=""))
        now = time.monotonic()
        crashes = [t for t in crashes if now - t < 60] + [now]
        report(message)
        if max_per_minute is not None and len(crashes) > max_per_minute:
            report(f"{len(crashes)} crashes within a minute: not restarting again")
            return 1
        delay = backoff_delay(len(crashes), backoff_s)  # calm minutes reset the backoff
        report(f"restarting in {delay:.1f} s ({len(crashes)} crash(es) in the last minute)")
        time.sleep(delay)
        try:
            server.restart()
        except LabBackendsError as exc:
            failed_start = exc
            continue
        report(f"restarted: pid {server.pid}, HTTP {server.http_url}, gRPC {server.grpc_url}")
    return 0
