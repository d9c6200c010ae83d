"""Triton's ``model_warmup`` measured (notebook 03b): the same cold load with and without it.

A ``model_warmup`` entry in a config makes every instance run its samples *during the load*:
``TritonModelInstance::WarmUp`` calls the backend's ``Execute`` directly, ``count`` times per sample
(core ``src/backend_model_instance.cc`` 599-668 at r24.10). The ``WARM_UP`` job reaches the
instance's backend thread right after its initialization (744-749) through the rate limiter's
payload queue *of that instance* (``src/rate_limiter.cc`` 242-270, ``SchedulePayload`` 539-549), as
the ``INIT`` job did (737-742): a queue, but not the model's scheduler queue, so no queue policy
applies and no client request is in it (the samples are prepared "to the state just before calling
instance execute function", 431-434). The model is marked READY only after every instance has been
created, warm-up included (``model_lifecycle.cc`` 799-804, in ``OnLoadFinal``), and the load API
answers only then (``model_repository_manager.cc`` 729-731): the warm-up is paid inside the load
call, not by the first client. The backend reports the warm-up's statistics like any others, one
execution per run of a sample (``infer_stats.cc`` 418): with our one sample of batch size 1 (see
:func:`~lab_backends.server.warmup.with_warmup`), ``execution_count`` is N instances x its ``count``
right after the load.

:func:`cold_load` unloads the model first: a load whose config differs only in ``instance_group``
(or not at all) is an in-place *update* of a READY model (``model_lifecycle.cc`` 488-505;
``ConfigChangeRequiresReload``, ``model_config_utils.cc`` 2435-2445, ignores ``instance_group`` and
``version_policy``), which keeps the statistics and the running stubs: not a cold start.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from lab_backends.client.infer import infer
from lab_backends.measure.stats import fetch_statistics, totals
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.config_changes import derive_config
from lab_backends.server.repository import read_config
from lab_backends.server.running import RunningServer
from lab_backends.server.warmup import with_warmup
from lab_backends.waiting import poll

#: The ONNX Runtime digits model: loads in ~1.5 s (torch's takes ~4 s), and the first ``run`` of a fresh
#: session does one-time set-up work: measured here, 26-130 ms of compute for the first request
#: against ~1.5 ms for the next ones.
MODEL = "digits_onnx"


@dataclass(frozen=True)
class WarmupRun:
    """One cold load of the model and its first requests, as the server counted and timed them."""

    warmup_count: int  #: the ``count`` of the one model_warmup sample (batch size 1): runs per instance (0: none)
    instances: int
    ready_s: float  #: the load call's duration: from asking to READY (the warm-up runs inside it)
    executions_at_ready: int  #: execution_count right after the load, before any client request
    inferences_at_ready: int
    first_compute_ms: float  #: the first client request's compute time on the server (input + infer + output)
    later_compute_ms: float  #: the median of the next requests', one at a time
    first_latency_ms: float  #: the first request's round trip, seen by the client


def _unloaded(server: RunningServer, model: str, timeout_s: float = 30.0) -> None:
    """Unload ``model`` if it is loaded, and wait until the repository says it is gone."""

    def state() -> str:
        return next((m.get("state", "") for m in server.repository_index() if m.get("name") == model), "")

    if state() in ("UNAVAILABLE", ""):
        return
    server.unload_model(model)
    poll(state, lambda s: s in ("UNAVAILABLE", ""), timeout_s, 0.05)


def _compute_ns(server: RunningServer, model: str) -> tuple[int, int, int]:
    """(successful requests, their compute ns: input + infer + output, executions) so far."""
    t = totals(fetch_statistics(server, model), model)
    compute_ns = sum(t.stages[s][1] for s in ("compute_input", "compute_infer", "compute_output"))
    return t.success[0], compute_ns, t.executions


def _one_request(server: RunningServer, model: str, inputs: dict[str, np.ndarray]) -> tuple[float, float]:
    """Send one request; its (server compute ms, client round trip ms), once the server has counted it."""
    count, ns, executions = _compute_ns(server, model)
    started = time.perf_counter()
    infer(server, model, inputs, protocol="grpc")
    latency_ms = (time.perf_counter() - started) * 1000
    # A backend reports a request a moment after the client has its answer, and its execution after that
    # (python_backend's PbMetricReporter, src/pb_metric_reporter.cc L44-L78 at r24.10): wait for both.
    after = poll(lambda: _compute_ns(server, model), lambda v: v[0] >= count + 1 and v[2] >= executions + 1,
                 5.0, 0.01)
    return (after[1] - ns) / 1e6, latency_ms


def shipped(model: str = MODEL) -> Any:
    """The model's ``config.pbtxt`` from this project's repository (the model need not be loaded)."""
    return read_config(MODEL_REPOSITORY / model)


def cold_load(server: RunningServer, warm: int = 0, instances: int = 1, later: int = 5, model: str = MODEL,
              base: Any = None) -> WarmupRun:
    """Unload ``model``, load it with ``instances`` instances (each running the warm-up sample ``warm`` times),
    then send one request and ``later`` more, one at a time, with the same zero input.

    ``base`` is the config to start from (default :func:`shipped`); its inputs must be FP32 and
    batched (``max_batch_size > 0``), as those of ``digits_onnx``, ``digits_torch`` and ``cost_model`` are.
    """
    base = base if base is not None else shipped(model)
    config = derive_config(base, {"instance_group": [{"kind": "KIND_CPU", "count": instances}]})
    if warm:
        config = with_warmup(config, warm)
    _unloaded(server, model)
    started = time.perf_counter()
    server.load_model(model, config=config)  # returns once the model is READY (or raises ModelLoadError)
    ready_s = time.perf_counter() - started
    at_ready = totals(fetch_statistics(server, model), model)  # no client request yet: the warm-up's alone
    inputs = {tensor.name: np.zeros([1, *tensor.dims], np.float32) for tensor in base.input}
    first_ms, first_latency = _one_request(server, model, inputs)
    later_ms = [_one_request(server, model, inputs)[0] for _ in range(later)]
    return WarmupRun(warm, instances, ready_s, at_ready.executions, at_ready.inferences, first_ms,
                     float(np.median(later_ms)) if later_ms else float("nan"), first_latency)


def compare(server: RunningServer, warm: int = 2, instances: int = 2, later: int = 5, model: str = MODEL,
            base: Any = None) -> pd.DataFrame:
    """The same cold load without and with ``model_warmup``: one row each; the model is unloaded at the end."""
    try:
        runs = {label: cold_load(server, count, instances, later, model, base)
                for label, count in (("without model_warmup", 0), (f"model_warmup, count {warm}", warm))}
    finally:
        _unloaded(server, model)  # the lesson's own server loaded it: give its stubs back
    return pd.DataFrame([asdict(run) for run in runs.values()], index=list(runs))
