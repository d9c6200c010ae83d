"""tests/native_checks.py's own helpers, without a server."""

from __future__ import annotations

from tests import native_checks


def _stats(successes: int, rows: int, batches: dict[int, int]) -> dict:
    """A statistics entry as the API gives it: ``batches`` maps a batch size to its executions."""
    return {"inference_stats": {"success": {"count": successes}, "fail": {"count": 0}}, "inference_count": rows,
            "execution_count": sum(batches.values()),
            "batch_stats": [{"batch_size": size, "compute_infer": {"count": n}} for size, n in batches.items()]}


def test_counted_waits_for_the_batch_record_of_the_last_execution(monkeypatch) -> None:
    """The backends report a batch's requests before its batch record, after the answers went out: a read in
    between counts the last request's rows but not its execution. That order is forced here: the second read
    has all 3 requests and 14 rows, and no execution of 8 yet."""
    reads = iter([_stats(2, 6, {1: 1, 5: 1}), _stats(3, 14, {1: 1, 5: 1}), _stats(3, 14, {1: 1, 5: 1, 8: 1})])
    monkeypatch.setattr(native_checks, "model_stats", lambda server, model: next(reads))
    after = native_checks.counted(None, "m", _stats(0, 0, {}), 3, 14, timeout_s=5)
    assert {int(b["batch_size"]) for b in after["batch_stats"]} == {1, 5, 8} and after["execution_count"] == 3
