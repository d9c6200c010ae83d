"""What the Python backend costs a framework: the digits MLP wrapped in Python vs served natively, per framework.

Four models of the repository, the same network and weights, the same config (max batch 64, dynamic
batching with a 2 ms delay, one CPU instance, one framework thread), on ONE server, measured in one
run:

* ``digits_tf`` / ``digits_torch``: the framework inside a Python-backend stub (shared memory and a
  message queue to the stub, the interpreter's GIL around every batch);
* ``digits_tf_native`` / ``digits_torch_native``: the same framework inside the server process, our
  backends ``lab_tensorflow`` (C, TensorFlow's C API) and ``lab_libtorch`` (C++, libtorch): gather,
  one framework run, scatter (c_backends/frameworks/).

Per model: the median latency of one request at a time (c=1: the fixed cost of a request, where the
hand-off shows) and the throughput with 16 in flight (c=16: the dynamic batcher's batches, where the
framework's matrix products dominate). :func:`ratios` sets native beside Python-wrapped for each
framework. ``lab-backends bench backends`` writes ``bench/native_backends.csv`` after its C-vs-Python
rows (:mod:`lab_backends.measure.backend_cost`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from lab_backends.measure.loadgen import run_closed
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.triton_server import TritonServer

#: (framework, how it is served) -> model, in the repository.
MODELS = {
    ("tensorflow", "python"): "digits_tf",
    ("tensorflow", "native"): "digits_tf_native",
    ("torch", "python"): "digits_torch",
    ("torch", "native"): "digits_torch_native",
}
LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY = 1, 16
#: One normalized digit-like row (any finite row costs the same in an MLP).
ROW = np.random.default_rng(35).uniform(-1, 1, (1, 64)).astype(np.float32)


def measure(server: Any, requests: int, duration_s: float,
            log: Callable[[str], None] = lambda message: None) -> pd.DataFrame:
    """One row per model: p50 at c=1 and throughput at c=16, the models alternating at each concurrency
    (a slow minute of the machine then touches all four, not one)."""
    rows = {model: {"framework": fw, "served": how, "model": model} for (fw, how), model in MODELS.items()}
    for c in (LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY):
        for model in MODELS.values():
            result = run_closed(server, model, c, inputs={"PIXELS": ROW}, requests=requests, duration_s=duration_s,
                                warmup_requests=max(20, 2 * c), warmup_s=1.0)
            s, w = result.summary, result.server
            row = rows[model]
            row["errors"] = row.get("errors", 0) + int(s["errors"])
            if c == LATENCY_CONCURRENCY:
                row["p50_ms_c1"] = s["p50_ms"]
                if w is not None:
                    row["compute_infer_ms_c1"] = w.compute_infer_ms
            else:
                row["throughput_rps_c16"] = s["throughput_rps"]
                row["p50_ms_c16"] = s["p50_ms"]
                if w is not None:
                    row["avg_batch_c16"] = w.avg_batch
            log(f"{model:20s} c={c:<3d} {s['throughput_rps']:8.0f} req/s  p50 {s['p50_ms']:.2f} ms")
    return pd.DataFrame(list(rows.values()))


def ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Per framework, native over Python-wrapped: throughput at c=16 (above 1: native serves more) and p50
    at c=1 (below 1: native answers sooner)."""
    out = []
    for framework, group in frame.groupby("framework", sort=False):
        by = group.set_index("served")
        out.append({
            "framework": framework,
            "throughput_c16_native_over_python": by.loc["native", "throughput_rps_c16"]
            / by.loc["python", "throughput_rps_c16"],
            "p50_c1_native_over_python": by.loc["native", "p50_ms_c1"] / by.loc["python", "p50_ms_c1"],
        })
    return pd.DataFrame(out)


def report(frame: pd.DataFrame) -> str:
    """The four rows and, per framework, the two ratios side by side."""
    table = frame[["framework", "served", "model", "throughput_rps_c16", "p50_ms_c1", "errors"]]
    lines = [table.to_string(index=False, float_format=lambda v: f"{v:.2f}"), ""]
    for r in ratios(frame).itertuples():
        lines.append(f"{r.framework:10s} native / Python-wrapped: throughput at c=16 "
                     f"x{r.throughput_c16_native_over_python:.2f}, p50 at c=1 x{r.p50_c1_native_over_python:.2f}")
    return "\n".join(lines)


def native_bench(requests: int, duration_s: float, log: Callable[[str], None] = print) -> pd.DataFrame:
    """The four models on one fresh server of the project's repository (set-up built the backends and the
    files they load: ``lab-backends setup``)."""
    with TritonServer(MODEL_REPOSITORY, models=list(MODELS.values()), target="local") as server:
        return measure(server, requests, duration_s, log=log)
