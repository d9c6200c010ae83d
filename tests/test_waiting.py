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


def test_settled_waits_for_a_quiet_period_and_sees_a_late_update():
    import time

    from lab_backends.waiting import settled

    start = time.monotonic()
    late = settled(lambda: 0 if time.monotonic() - start < 0.02 else 1, interval_s=0.005, quiet_s=0.05)
    assert late == 1, "an update 20 ms after the first read is inside the quiet period: it is seen"
    assert time.monotonic() - start >= 0.07


def test_settled_gives_up_after_its_reads_and_returns_the_last_value():
    from lab_backends.waiting import settled

    counter = itertools.count()
    assert settled(lambda: next(counter), interval_s=0, attempts=5) == 5  # never quiet: the 6th read
