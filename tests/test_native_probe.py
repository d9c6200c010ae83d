"""lessons/native_probe.py's wait for a burst's batch records (09c and 09d's checkers), without a server."""

from __future__ import annotations

import numpy as np

from lab_backends.lessons.native_probe import Counts, Hints, ServedProbe


class _Statistics:
    """A statistics API whose reads come in a scripted order: ``(execution_count, {batch size: executions})``."""

    def __init__(self, reads: list[tuple[int, dict[int, int]]]) -> None:
        self.reads = iter(reads)

    def statistics(self, model: str) -> dict:
        executions, batches = next(self.reads)
        return {"model_stats": [{"execution_count": executions, "batch_stats": [
            {"batch_size": size, "compute_infer": {"count": n}} for size, n in batches.items()]}]}


def _probe(reads: list[tuple[int, dict[int, int]]]) -> ServedProbe:
    hints = Hints("digits_tf_native", "your backend", "", "", "", "")
    return ServedProbe(_Statistics(reads), "m", np.zeros((1, 64), np.float32), np.zeros((1, 10), np.float32),
                       ("answer.c",), hints)


def test_counts_after_waits_for_the_burst_s_last_batch_record() -> None:
    """A burst of 3 requests of 2 rows that ran one at a time: the backend has answered all three, and the
    first read after the answers still lacks the third record. Read then, 2 executions for 3 requests would
    say the burst was batched; the wait reads on until the records hold the burst's 6 rows."""
    probe = _probe([(10, {2: 10}), (12, {2: 12}), (13, {2: 13})])
    before = probe.counts()
    after = probe.counts_after(before, 6)
    assert before == Counts(10, 20) and after == Counts(13, 26)
    assert after.executions - before.executions == 3  # one execution a request: not batched
