"""Waiting for something the server reports a moment late, with a deadline.

Triton writes several things shortly *after* the client has its answer: statistics count a request
when it is released, stubs' log lines reach the server log through a queue. Reading right away
can be too early; reading forever is not allowed. :func:`poll` reads again until the value is
good enough or the deadline passes, and hands back the last value either way, so the caller
decides what a short value means (an error for a checker, a table for a notebook).
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def poll(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float, interval_s: float = 0.05) -> T:
    """``read()`` until ``done(value)`` or ``timeout_s`` has passed; the last value read."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


#: How long a counter must stay unchanged to count as settled. Triton's lag between a response and
#: its statistics is one hand-off between server threads; 50 ms leaves room for the scheduler delays
#: of a busy machine, where two reads 5 ms apart could both come before the update (seen in a flake
#: hunt with one core busy: a server's count read right after its only answer said 0).
QUIET_S = 0.05


def settled(read: Callable[[], T], key: Callable[[T], Any] = lambda value: value, interval_s: float = 0.005,
            attempts: int = 400, quiet_s: float = QUIET_S) -> T:
    """``read()`` until the value (by ``key``) has not changed for ``quiet_s``; at most ``attempts`` reads more.

    For counters that Triton updates a moment after the client has its answer: with nothing in
    flight, a value that stays the same for ``quiet_s`` has settled. Returns the last value read.
    """
    value = read()
    since = time.monotonic()
    for _ in range(attempts):
        if time.monotonic() - since >= quiet_s:
            break
        time.sleep(interval_s)
        again = read()
        if key(again) != key(value):
            since = time.monotonic()
        value = again
    return value
