"""Drive a stateful model through Triton's sequence batcher: interleaved and concurrent sequences.

``running_mean`` keeps one running mean per *sequence*. A sequence is a run of requests that share
a correlation ID (``sequence_id``); the first carries ``sequence_start``, the last
``sequence_end``. The sequence batcher turns those flags into the model's control inputs
(``START``, ``END``, ``CORRID``) and routes every request of a sequence to the same instance, in
order, so the model can keep state between requests without any database.

Three ways to drive several sequences, each answering a different question:

* :func:`drive_interleaved`: one client advances each sequence one step in turn (A1 B1 C1 A2 B2
  ...). Several sequences are *live* at once, and each must still see only its own values;
* :func:`lab_backends.measure.concurrent_sequences.drive_concurrent` (measure layer: it reads
  the statistics): one thread per sequence, all at once;
* :func:`lab_backends.measure.concurrent_sequences.fill_slots`: one sequence more than the
  batcher has slots (per instance, ``max_candidate_sequences`` under ``oldest``), none ended: the
  extra one waits in the backlog, unanswered, until another sequence ends.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.errors import SequenceError
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


def check_sequences(sequences: Mapping[int, Sequence[float]]) -> None:
    """One clear error for bad ``{correlation_id: [values]}`` input (also used by measure/concurrent_sequences)."""
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
    check_sequences(sequences)
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


def is_live(server: RunningServer, corrid: int, model: str = MODEL) -> bool:
    """Is sequence ``corrid`` still open on the server (started and not yet ended)?

    Probes with a request that continues *and ends* the sequence: the sequence batcher refuses it
    ("must specify the START flag") when no such sequence is open. If it was open, the probe
    closes it, so call this only on sequences you are done with.
    """
    try:
        step(server, corrid, 0.0, start=False, end=True, model=model)
    except InferenceServerException as exc:
        if "START" in str(exc):
            return False
        raise
    return True
