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


def settled(read: Callable[[], T], key: Callable[[T], Any] = lambda value: value, interval_s: float = 0.005,
            attempts: int = 50) -> T:
    """``read()`` until two reads in a row agree (by ``key``), at most ``attempts`` more times; the last value.

    For counters that Triton updates a moment after the client has its answer: with nothing in
    flight, two equal reads in a row mean they have settled.
    """
    value = read()
    for _ in range(attempts):
        time.sleep(interval_s)
        again = read()
        if key(again) == key(value):
            return again
        value = again
    return value
