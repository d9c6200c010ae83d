"""Notebook 05: what each wrapped framework costs the server, per model instance.

Every instance of a Python-backend model is its own *stub* process, and the framework is imported
there: its start-up time is the model's load time, its memory is the stub's resident memory, its
threads are the stub's threads. Measured from outside, on the real server:

* :func:`load_each` loads the models one after another into a server started with none of them
  (``TritonServer(models=[])``), timing each load (the load API returns once the model is READY);
* :func:`stub_footprint` reads each model's stub processes (found by :func:`lab_backends.server.health.stubs`
  from their command lines) with psutil: resident memory (RSS) and OS threads;
* :func:`summary` puts those beside the latency and throughput of :func:`frameworks.side_by_side`.

Stub processes can only be read on a server started here (target ``local``); on a shared server the
models are already loaded, and the columns say "not measured" (NaN) instead of guessing.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import pandas as pd
import psutil

from lab_backends.errors import LabBackendsError
from lab_backends.lessons import frameworks
from lab_backends.server import health
from lab_backends.server.running import RunningServer

FOOTPRINT_COLUMNS = ["instances", "rss_mb_per_instance", "threads_per_instance"]


def _is_local(server: RunningServer) -> bool:
    return getattr(server, "target", "local") == "local" and getattr(server, "pid", None) is not None


def stub_footprint(server: RunningServer, models: Sequence[str]) -> pd.DataFrame:
    """Per model: its live stub processes, their mean resident memory (MB) and mean OS thread count.

    The model of a stub is the folder of the ``model.py`` on its command line (``<model>/<version>/model.py``).
    """
    rows = {m: {"instances": 0, "rss_mb_per_instance": math.nan, "threads_per_instance": math.nan} for m in models}
    try:
        live = health.stubs(server)
    except LabBackendsError:  # not a local server: its processes are not ours to read
        return pd.DataFrame.from_dict(rows, orient="index")[FOOTPRINT_COLUMNS]
    seen: dict[str, list[tuple[int, int]]] = {}
    for stub in live.values():
        model = stub.model_file.parent.parent.name
        if model not in rows:
            continue
        try:
            proc = psutil.Process(stub.pid)
            seen.setdefault(model, []).append((proc.memory_info().rss, proc.num_threads()))
        except psutil.Error:
            continue  # exited since it was listed
    for model, readings in seen.items():
        rows[model] = {"instances": len(readings),
                       "rss_mb_per_instance": sum(r for r, _ in readings) / len(readings) / 2**20,
                       "threads_per_instance": sum(t for _, t in readings) / len(readings)}
    return pd.DataFrame.from_dict(rows, orient="index")[FOOTPRINT_COLUMNS]


def load_each(server: RunningServer, models: Sequence[str]) -> pd.DataFrame:
    """Load ``models`` one at a time, timing each load, then read their stubs: one row per model.

    One at a time so that each load has the machine to itself (Triton loads the models of
    ``--load-model`` in parallel, which on 2 cores would time the neighbours too). A model that is
    already READY (a shared server, or a second call) is not reloaded: its ``load_s`` is NaN.
    """
    rows = []
    for model in models:
        load_s = math.nan
        if _is_local(server) and not server.model_ready(model):
            started = time.perf_counter()
            server.load_model(model)  # returns once READY, raises ModelLoadError with Triton's reason
            load_s = time.perf_counter() - started
        rows.append({"model": model, "framework": frameworks.framework_of(model), "load_s": load_s})
    frame = pd.DataFrame(rows).set_index("model")
    return frame.join(stub_footprint(server, models))


def summary(costs: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """One row per model: start-up, memory and threads (:func:`load_each`) beside latency at one
    request in flight and throughput at the busiest point of ``speed`` (:func:`frameworks.side_by_side`)."""
    top = int(speed["concurrency"].max())
    alone = speed[speed["concurrency"] == speed["concurrency"].min()].set_index("config")
    busy = speed[speed["concurrency"] == top].set_index("config")
    out = costs[["framework", "load_s", "rss_mb_per_instance", "threads_per_instance"]].copy()
    out["p50_ms_c1"] = alone["p50_ms"]
    out[f"throughput_rps_c{top}"] = busy["throughput_rps"]
    out[f"avg_batch_c{top}"] = busy["avg_batch"]
    return out
