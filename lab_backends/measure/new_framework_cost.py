"""Three ways to serve the same network, measured on one server: what bringing up a new framework bought.

The digits MLP (64-2048-2048-10, the same weights) as

* ``digits_torch``: PyTorch inside a Python-backend stub (a process of its own, torch imported there);
* ``digits_torch_native``: libtorch inside the server, our C++ backend ``lab_libtorch``;
* ``digits_et``: the network exported to ExecuTorch (XNNPACK-delegated) inside the server, our C++
  backend ``lab_executorch`` (notebook 09d).

Same config for the three (max batch 64, dynamic batching with a 2 ms delay, one CPU instance, one
framework thread). :func:`bench` starts ONE server with none of them, loads each alone and times the
load (the load API returns once READY), reads the memory it added (the server's resident memory plus
its children's, where a stub lives), then measures each at one request in flight (p50: the fixed cost
of a request) and at 16 (throughput: the batcher's batches), the models alternating at each
concurrency. :func:`footprint` lists what each way puts on disk: the framework's libraries and the
model file. Every number comes from the run; nothing here is a constant.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import psutil

from lab_backends.measure.loadgen import run_closed
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY
from lab_backends.server import cbackend, executorch_backend, native_backends
from lab_backends.server.triton_server import TritonServer

#: How it is served -> model, in the repository.
MODELS = {"Python stub + PyTorch": "digits_torch", "lab_libtorch (C++)": "digits_torch_native",
          "lab_executorch (C++)": "digits_et"}
LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY = 1, 16
ROW = np.random.default_rng(49).uniform(-1, 1, (1, 64)).astype(np.float32)


def _tree_rss(pid: int) -> int:
    """The server's resident memory plus its children's (the Python backend's stubs)."""
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue  # exited since it was listed
    return total


def load_and_weigh(server: Any, models: dict[str, str]) -> pd.DataFrame:
    """Load each model alone (a server started with none), timing the load and reading the memory it added."""
    rows = []
    for served, model in models.items():
        before = _tree_rss(server.pid)
        started = time.perf_counter()
        server.load_model(model)
        load_s = time.perf_counter() - started
        rows.append({"served": served, "model": model, "load_s": load_s,
                     "memory_added_mb": (_tree_rss(server.pid) - before) / 2**20})
    return pd.DataFrame(rows)


def speed(server: Any, models: dict[str, str], requests: int, duration_s: float,
          log: Callable[[str], None] = lambda message: None) -> pd.DataFrame:
    """p50 at c=1 and throughput at c=16 per model, the models alternating at each concurrency."""
    rows: dict[str, dict] = {model: {"model": model, "errors": 0} for model in models.values()}
    for c in (LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY):
        for model in models.values():
            result = run_closed(server, model, c, inputs={"PIXELS": ROW}, requests=requests, duration_s=duration_s,
                                warmup_requests=max(20, 2 * c), warmup_s=1.0)
            s, w = result.summary, result.server
            row = rows[model]
            row["errors"] += int(s["errors"])
            if c == LATENCY_CONCURRENCY:
                row["p50_ms_c1"] = s["p50_ms"]
            else:
                row["throughput_rps_c16"] = s["throughput_rps"]
                row["avg_batch_c16"] = w.avg_batch if w is not None else math.nan
            log(f"{model:20s} c={c:<3d} {s['throughput_rps']:8.0f} req/s  p50 {s['p50_ms']:.2f} ms")
    return pd.DataFrame(list(rows.values()))


def _mb(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def footprint(backend_dir: Path = BACKEND_DIR) -> pd.DataFrame:
    """What each way needs on disk beside the server: the framework's libraries (and our backend), the model file."""
    torch_libs = list(native_backends.libtorch_runtime().libraries)
    et_folder = cbackend.library_path(executorch_backend.NAME, backend_dir).parent
    return pd.DataFrame([
        {"model": "digits_torch", "framework_libraries_mb": _mb(torch_libs),
         "model_file_mb": _mb([MODEL_REPOSITORY / "digits_torch" / "1" / "model.pt"])},
        {"model": "digits_torch_native",
         "framework_libraries_mb": _mb([*torch_libs, cbackend.library_path(native_backends.LIBTORCH_BACKEND,
                                                                            backend_dir)]),
         "model_file_mb": _mb([MODEL_REPOSITORY / "digits_torch_native" / "1" / "model.pt"])},
        {"model": "digits_et", "framework_libraries_mb": _mb(sorted(et_folder.glob("*.so"))),
         "model_file_mb": _mb([MODEL_REPOSITORY / "digits_et" / "1" / "model.pte"])},
    ])


def weighed(server: Any, models: dict[str, str] = MODELS) -> pd.DataFrame:
    """Each model loaded alone on ``server`` (started with none), beside what its way needs on disk."""
    return load_and_weigh(server, models).merge(footprint(), on="model")


def bench(requests: int, duration_s: float, log: Callable[[str], None] = print) -> pd.DataFrame:
    """The three rows, from one fresh server of the project's repository (``lab-backends setup`` built the
    backends and the files they load)."""
    with TritonServer(MODEL_REPOSITORY, models=[], target="local") as server:
        loads = weighed(server)
        measured = speed(server, MODELS, requests, duration_s, log=log)
    return loads.merge(measured, on="model")


def report(frame: pd.DataFrame) -> str:
    columns = ["served", "model", "load_s", "memory_added_mb", "framework_libraries_mb", "model_file_mb",
               "p50_ms_c1", "throughput_rps_c16", "errors"]
    return frame[columns].to_string(index=False, float_format=lambda v: f"{v:.2f}")
