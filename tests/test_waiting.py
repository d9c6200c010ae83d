"""lab_backends.waiting.poll: reads until good enough or the deadline, and says what it last saw."""

from __future__ import annotations

import itertools

from lab_backends.waiting import poll


def test_poll_returns_as_soon_as_the_value_is_good_enough():
    counter = itertools.count()
    assert poll(lambda: next(counter), lambda n: n >= 3, timeout_s=30, interval_s=0) == 3


def test_poll_gives_the_last_value_when_time_runs_out():
    reads = []
    value = poll(lambda: reads.append(1) or len(reads), lambda n: False, timeout_s=0.05, interval_s=0.01)
    assert value == len(reads) and len(reads) >= 2  # read again while waiting, then gave up
