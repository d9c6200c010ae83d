"""A deadline for every gRPC request a piece of code sends without one: while an exercise is judged.

Why: a gRPC call of tritonclient waits for ever by default (no ``client_timeout``), and a learner's answer can
keep a request from ever being answered (a ``model.py`` whose execute never returns, a C backend that never
sends a response, a server stuck in its signal handler: platform notes). The C exercises' checkers give each
of their own requests a short deadline (:mod:`lab_backends.lessons.native_faults`); this is the backstop for
every other request a checker sends through :func:`lab_backends.client.infer.infer`: ``exercises.check``
runs the checker inside :func:`requests_within`, and ``infer`` adds the deadline to a gRPC call that names
none. (tritonclient's HTTP client already ends a call after its ``network_timeout``, 60 s by default.)

A :class:`contextvars.ContextVar`: it holds in the thread (or task) that set it, not in threads the checker
starts (those pass their own timeouts, as ``authoring.send_together`` does).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

_DEADLINE: ContextVar[float | None] = ContextVar("lab_request_deadline_s", default=None)


@contextlib.contextmanager
def requests_within(seconds: float) -> Iterator[None]:
    """Inside the block, a gRPC request sent by ``infer`` without a ``client_timeout`` gets ``seconds``."""
    token = _DEADLINE.set(seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current() -> float | None:
    """The deadline in force here (seconds), or ``None`` outside :func:`requests_within`."""
    return _DEADLINE.get()
