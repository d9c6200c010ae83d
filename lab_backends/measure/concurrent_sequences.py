"""Several sequences of a stateful model at once, and what the sequence batcher made of them.

One thread per sequence (each with its own gRPC client), all released together: with the
``oldest`` strategy requests of different sequences share an ``execute`` (a batch), which the
statistics of the same window show. Lives in the measure layer because it reads those statistics.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from lab_backends.client.sequences import MODEL, _check_sequences, expected_means, step
from lab_backends.measure import stats as _stats
from lab_backends.measure.stats import settled_statistics
from lab_backends.server.running import RunningServer


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
