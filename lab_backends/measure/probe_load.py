"""A small, bounded load that keeps every answer: which request got which response, or which error.

The load generators in :mod:`lab_backends.measure.loadgen` measure speed and throw the responses
away. The scheduler lessons need the opposite: the ``request_id`` of every request (to find it in
the trace), what the model answered (``scheduler_probe`` says which instance ran it and the batch
size it saw), and the exact error Triton gave the ones it refused or expired. Speed matters less
than the record, so this uses ``tritonclient``'s gRPC ``async_infer`` with callbacks, bounded in
request count, in flight and in time.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from lab_backends.client.infer import make_inputs
from lab_backends.errors import LoadSettingError

#: The columns of :func:`probe_load`'s frame.
COLUMNS = [
    "request_id",
    "priority",
    "ok",
    "error",
    "instance",
    "pid",
    "batch",
    "lengths",
    "total",
    "cores",
    "sent_s",
    "done_s",
    "latency_ms",
]
_EMPTY = {"instance": None, "pid": None, "batch": None, "lengths": None, "total": None, "cores": None}


def _answer(result: Any) -> dict[str, Any]:
    """The probe's outputs as plain values; models without them give ``None``s (only ``ok`` counts)."""
    found: dict[str, Any] = dict(_EMPTY)
    for name, key, cast in (
        ("INSTANCE", "instance", lambda v: v.decode() if isinstance(v, bytes) else str(v)),
        ("PID", "pid", int),
        ("BATCH", "batch", int),
        ("LENGTHS", "lengths", int),
        ("TOTAL", "total", float),
        ("CORES", "cores", float),
    ):
        array = result.as_numpy(name)
        if array is not None and array.size:
            found[key] = cast(array.reshape(-1)[0])
    return found


def probe_load(
    server: Any,
    model: str,
    n: int,
    *,
    concurrency: int = 8,
    inputs: Mapping[str, np.ndarray] | Callable[[int], Mapping[str, np.ndarray]] | None = None,
    prefix: str = "probe",
    priorities: Sequence[int] | None = None,
    timeout_us: int | None = None,
    deadline_s: float = 60.0,
) -> pd.DataFrame:
    """Send ``n`` requests (``request_id`` = ``<prefix>-<i>``), at most ``concurrency`` in flight.

    ``inputs`` is one set of tensors for every request, or a function of the request's index
    (requests of different shapes, for ragged batching). ``priorities[i]`` (if given) is request
    *i*'s priority (1 is the highest; 0 means the model's default); ``timeout_us`` is the
    per-request timeout Triton applies in its queue (the model must allow the override). Refused
    and expired requests are rows with ``ok=False`` and Triton's own ``error`` text: they are
    results here, not failures. Times are seconds from the first send.
    """
    if not 1 <= n <= 5000:
        raise LoadSettingError(f"probe_load sends 1..5000 requests, not {n}")
    if not 1 <= concurrency <= 512:
        raise LoadSettingError(f"concurrency must be in 1..512, not {concurrency}")
    if priorities is not None and len(priorities) != n:
        raise LoadSettingError(f"priorities holds {len(priorities)} values for {n} requests: give one per request")
    if inputs is None:
        inputs = {"INPUT0": np.ones((1, 4), np.float32)}
    shared = None if callable(inputs) else make_inputs(inputs)
    client = server.grpc_client
    slots = threading.Semaphore(concurrency)
    finished = threading.Semaphore(0)
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    origin = time.monotonic()

    def callback(i: int, sent: float):
        def done(result: Any, error: Any) -> None:
            now = time.monotonic() - origin
            row = {
                "ok": error is None,
                "error": "" if error is None else str(error),
                "done_s": now,
                "latency_ms": (now - sent) * 1000.0,
            }
            row.update(_answer(result) if error is None else _EMPTY)
            rows[i].update(row)
            slots.release()
            finished.release()

        return done

    end = origin + deadline_s
    sent_count = 0
    for i in range(n):
        if not slots.acquire(timeout=max(0.0, end - time.monotonic())):
            break
        sent = time.monotonic() - origin
        priority = int(priorities[i]) if priorities is not None else 0
        rows[i] = {"request_id": f"{prefix}-{i}", "priority": priority, "sent_s": sent}
        tensors = shared if shared is not None else make_inputs(inputs(i))
        client.async_infer(
            model, tensors, callback(i, sent), request_id=f"{prefix}-{i}", priority=priority, timeout=timeout_us
        )
        sent_count += 1
    for _ in range(sent_count):
        if not finished.acquire(timeout=max(0.0, end - time.monotonic())):
            raise LoadSettingError(
                f"{model!r} did not answer all {sent_count} requests within {deadline_s:.0f} s; "
                "send fewer, or give the load a longer deadline_s"
            )
    frame = pd.DataFrame(rows[:sent_count], columns=COLUMNS)
    frame["ok"] = frame["ok"].astype(bool)
    return frame
