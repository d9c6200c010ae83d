"""What the batching panel says when a run goes wrong: Triton's own words, short, and a crash named as one.

Triton 2.51 can die under the panel's load right after a reload (docs/reliability.md, finding 14:
a SIGSEGV, once, in a fresh clone's browser test). Without this, the next call to the dead server
fails with "connection refused", which explains nothing; :func:`named` turns any error of a run
whose server has died into the :class:`~lab_backends.errors.ServerCrashed` that says so, with the
log's own words (:mod:`lab_backends.server.crash`).
"""

from __future__ import annotations

from lab_backends.server.crash import crash_error, crashed


def short(exc: BaseException | str) -> str:
    """The readable part of an error: Triton's own message, without client boilerplate."""
    text = str(exc).strip()
    text = text.replace("[StatusCode.INVALID_ARGUMENT]", "").replace("[StatusCode.INTERNAL]", "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:3])[:600]


def named(server: object, exc: BaseException) -> BaseException:
    """``exc``, or the server's crash when the server we started has died (the crash is the cause)."""
    code = crashed(server)
    return exc if code is None else crash_error(server, code, advice="server.restart() brings it back")
