"""Drive a stateful model through Triton's sequence batcher: interleaved and concurrent sequences.

``running_mean`` keeps one running mean per *sequence*. A sequence is a run of requests that share
a correlation ID (``sequence_id``); the first carries ``sequence_start``, the last
``sequence_end``. The sequence batcher turns those flags into the model's control inputs
(``START``, ``END``, ``CORRID``) and routes every request of a sequence to the same instance, in
order, so the model can keep state between requests without any database.

Two ways to drive several sequences, each answering a different question:

* :func:`drive_interleaved`: one client advances each sequence one step in turn (A1 B1 C1 A2 B2
  ...). Several sequences are *live* at once, and each must still see only its own values;
* :func:`drive_concurrent`: one thread per sequence, all at once. With the ``oldest`` strategy
  requests of different sequences share an ``execute`` (a batch), visible in the statistics.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lab_backends.client.infer import infer
from lab_backends.errors import SequenceError
from lab_backends.measure import stats as _stats
from lab_backends.measure.stats import settled_statistics
from lab_backends.server.running import RunningServer

MODEL = "running_mean"


def step(
    server: RunningServer, corrid: int, value: float, start: bool = False, end: bool = False,
    protocol: str = "grpc", client: Any = None, model: str = MODEL,
) -> tuple[float, int]:
    """Send one value of sequence ``corrid``; returns the model's (mean, count) so far."""
    extra = {"client_timeout": 30} if protocol == "grpc" else {}
    out = infer(
        server, model, {"VALUE": np.array([[value]], np.float32)}, protocol=protocol, client=client,
        sequence_id=int(corrid), sequence_start=bool(start), sequence_end=bool(end), **extra,
    )
    return float(out["MEAN"].reshape(-1)[0]), int(out["COUNT"].reshape(-1)[0])


def _check_sequences(sequences: Mapping[int, Sequence[float]]) -> None:
    if not sequences:
        raise SequenceError("no sequences given: pass {correlation_id: [values, ...]}")
    for corrid, values in sequences.items():
        if not isinstance(corrid, (int, np.integer)) or corrid <= 0:
            raise SequenceError(f"correlation IDs must be positive integers (0 means 'no sequence'), got {corrid!r}")
        if len(values) == 0:
            raise SequenceError(f"sequence {corrid} has no values: a sequence needs at least one request")


def expected_means(values: Sequence[float]) -> np.ndarray:
    """The running mean after each value, computed here (what the model must answer)."""
    values = np.asarray(values, dtype=np.float64)
    return np.cumsum(values) / np.arange(1, len(values) + 1)


def drive_interleaved(
    server: RunningServer, sequences: Mapping[int, Sequence[float]], protocol: str = "grpc", model: str = MODEL
) -> pd.DataFrame:
    """Advance every sequence by one value per round, in turn; one row per request.

    Columns: ``round``, ``corrid``, ``value``, ``start``, ``end``, ``mean``, ``count`` and
    ``expected`` (the running mean computed here), so ``mean == expected`` is the whole lesson.
    """
    _check_sequences(sequences)
    rows = []
    for i in range(max(len(v) for v in sequences.values())):
        for corrid, values in sequences.items():
            if i >= len(values):
                continue  # this sequence already ended
            start, end = i == 0, i == len(values) - 1
            mean, count = step(server, corrid, values[i], start, end, protocol=protocol, model=model)
            rows.append({"round": i, "corrid": corrid, "value": float(values[i]), "start": start, "end": end,
                         "mean": mean, "count": count, "expected": float(expected_means(values[: i + 1])[-1])})
    return pd.DataFrame(rows)


@dataclass
class ConcurrentRun:
    """What :func:`drive_concurrent` saw: per-request rows and the server's statistics window."""

    requests: pd.DataFrame
    server: _stats.ServerWindow

    @property
    def correct(self) -> bool:
        return bool(np.allclose(self.requests["mean"], self.requests["expected"], rtol=1e-5))


def drive_concurrent(
    server: RunningServer, sequences: Mapping[int, Sequence[float]], model: str = MODEL, timeout_s: float = 60.0
) -> ConcurrentRun:
    """Run every sequence in its own thread (its own gRPC client), all at once.

    The threads start together (a barrier), so the sequence batcher has several sequences with a
    request waiting at the same moment: with the ``oldest`` strategy it puts them in one batch.
    """
    import tritonclient.grpc as grpcclient

    _check_sequences(sequences)
    barrier = threading.Barrier(len(sequences), timeout=timeout_s)

    def run(corrid: int, values: Sequence[float]) -> list[dict]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        rows = []
        try:
            barrier.wait()
            for i, value in enumerate(values):
                mean, count = step(server, corrid, value, i == 0, i == len(values) - 1, client=client, model=model)
                rows.append({"corrid": corrid, "step": i, "value": float(value), "mean": mean, "count": count,
                             "expected": float(expected_means(values[: i + 1])[-1])})
        finally:
            client.close()
        return rows

    before = settled_statistics(server, model)
    with ThreadPoolExecutor(len(sequences), thread_name_prefix="sequence") as pool:
        futures = [pool.submit(run, c, v) for c, v in sequences.items()]
        rows = [row for f in futures for row in f.result(timeout=timeout_s)]
    after = settled_statistics(server, model)
    return ConcurrentRun(pd.DataFrame(rows), _stats.window(before, after, model))


def is_live(server: RunningServer, corrid: int, model: str = MODEL) -> bool:
    """Is sequence ``corrid`` still open on the server (started and not yet ended)?

    Probes with a request that continues *and ends* the sequence: the sequence batcher refuses it
    ("must specify the START flag") when no such sequence is open. If it was open, the probe
    closes it, so call this only on sequences you are done with.
    """
    from tritonclient.utils import InferenceServerException

    try:
        step(server, corrid, 0.0, start=False, end=True, model=model)
    except InferenceServerException as exc:
        if "START" in str(exc):
            return False
        raise
    return True
