"""The experiments of ``09b_batching_strategy_in_c``: a custom batching strategy in C on a real server.

The strategy (``c_backends/batching/byte_budget/byte_budget.c``) caps the input bytes of a batch.
It is shown on ``ragged_probe``, whose ``INPUT0`` has a variable length (``dims [-1]``,
``allow_ragged_batch``): requests of 8, 32 and 128 floats weigh 32, 128 and 512 bytes, so a batch of
16 requests (``max_batch_size``) can weigh anything from 512 bytes to 8 KiB. Each function here
reloads the model (an override derived from the shipped config: :mod:`~lab_backends.server.config_changes`),
sends a burst that queues far more than one batch, and rebuilds every executed batch from the
trace: the requests of one ``execute()`` share their compute stamps (the Python backend reports the
same ones for a whole batch, python_backend ``src/pb_metric_reporter.cc`` 44-67 at r24.10), and
each request's bytes are known because we sent them. ``batch_stats`` (the server's own count of
executions per batch size) is read before and after as a second, independent record.

:func:`tagged_burst` sends requests that carry a request parameter (the exercise's ``tenant``);
:func:`allocation_faults` is the reviewer's static check that what a strategy allocates is freed.

Deferred import: matplotlib (~1 s), only when a figure is drawn.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ModelLoadError
from lab_backends.lessons import c_source
from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import compute_spans, lanes
from lab_backends.server import cbackend
from lab_backends.server.config_changes import apply_config, derive_config

MODEL = "ragged_probe"
STRATEGY = "byte_budget"
SOURCE = cbackend.STRATEGIES_DIR / STRATEGY / f"{STRATEGY}.c"
PARAMETER = "MAX_BATCH_BYTES"
#: Floats per request, in turn: 32, 128 and 512 bytes of FP32.
LENGTHS = (8, 32, 128)
BUDGET = 1024
#: Numbers each run's request ids, so that two runs on one server never share an id in the trace.
_RUNS = itertools.count(1)


def build(strategy_dir: str | Path = cbackend.STRATEGY_DIR, source: str | Path = SOURCE, name: str = STRATEGY,
          extra_flags: Sequence[str] = ()) -> Path:
    """Compile a strategy with the backends' flags (-Wall -Wextra -Werror, -z defs); the library's path."""
    return cbackend.build_strategy(source, name, strategy_dir, extra_flags=tuple(extra_flags))


def every_batch_closed(max_batch_size: int) -> dict[str, Any]:
    """The ``dynamic_batching`` that closes each batch it sends: every size preferred, no queue delay.

    Why a strategy needs it in Triton 2.51: a batch sent without being *closed* (saturated) stays
    open to more requests until an instance starts it (core ``src/dynamic_batch_scheduler.cc``
    343-346: a new batch only when the current one is saturated or executing; 517: the requests
    already in it), and each time the batcher resumes it, it hands the strategy a fresh state
    (``BatchInitialize``, 502-508), because taking requests off the queue invalidated its cursor
    (``src/scheduler_utils.cc`` 410). The strategy then counts from zero while the batch already
    holds requests. A batch is closed when it reaches a preferred size with no queue delay
    (596-599): with every size preferred, always. A refusal from the strategy closes it too
    (564-571, 613-616), but not with a queue delay once a preferred size was reached earlier in
    the same pass and the delay has not yet run out (591-603 returns first): so no delay here
    (:func:`trickle` measures one).
    """
    return {"preferred_batch_size": list(range(1, max_batch_size + 1))}


def with_strategy(base: Any, library: str | Path, close_every_batch: bool = True, **parameters: Any) -> Any:
    """``base`` with one instance, ``TRITON_BATCH_STRATEGY_PATH`` = ``library`` (+ string ``parameters``)
    and, unless ``close_every_batch`` is False, :func:`every_batch_closed` as its dynamic batcher."""
    params = {"TRITON_BATCH_STRATEGY_PATH": {"string_value": str(library)}}
    params.update({k: {"string_value": str(v)} for k, v in parameters.items()})
    override: dict[str, Any] = {"parameters": params, "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
    if close_every_batch:
        override["dynamic_batching"] = every_batch_closed(base.max_batch_size)
    return derive_config(base, override)


def without_strategy(base: Any) -> Any:
    """``base`` with one instance and no strategy parameters: the plain dynamic batcher."""
    config = derive_config(base, {"instance_group": [{"kind": "KIND_CPU", "count": 1}]})
    for key in ("TRITON_BATCH_STRATEGY_PATH", PARAMETER):
        if key in config.parameters:
            del config.parameters[key]
    return config


def load_error(server: Any, base: Any, library: str | Path, model: str = MODEL, **parameters: Any) -> str:
    """Triton's reason when ``model`` is loaded with the strategy and ``parameters``; ``""`` if it loaded."""
    try:
        apply_config(server, model, with_strategy(base, library, **parameters), base)
    except ModelLoadError as exc:
        return exc.reason
    return ""


def tagged_burst(server: Any, model: str, inputs: Sequence[Mapping[str, np.ndarray]],
                 parameters: Sequence[Mapping[str, Any] | None] | None = None, prefix: str = "burst",
                 timeout_s: float = 30.0, gap_s: float = 0.0) -> pd.DataFrame:
    """Send every request at once (gRPC async; ``gap_s`` apart if given), request *i* with ``parameters[i]``;
    wait at most ``timeout_s`` for the answers.

    One row per request: ``request_id``, ``ok``, ``error`` (Triton's text, or "no answer within
    ...") and what the model answered about its batch (``batch``; ``instance``/``pid`` when it says).
    """
    client = server.grpc_client
    rows: list[dict[str, Any]] = [{"request_id": f"{prefix}-{i}", "ok": False,
                                   "error": f"no answer within {timeout_s:g} s", "batch": None,
                                   "instance": None, "pid": None} for i in range(len(inputs))]
    done = threading.Semaphore(0)

    def callback(i: int):
        def finish(result: Any, error: Any) -> None:
            if error is None:
                rows[i].update(ok=True, error="", **_answer(result))
            elif "DEADLINE_EXCEEDED" not in str(error):  # else: our client_timeout, "no answer" stays
                rows[i].update(error=str(error))
            done.release()
        return finish

    for i, tensors in enumerate(inputs):
        if gap_s and i:
            time.sleep(gap_s)
        params = dict(parameters[i] or {}) if parameters is not None else {}
        client.async_infer(model, make_inputs(tensors), callback(i), request_id=rows[i]["request_id"],
                           parameters=params or None, client_timeout=timeout_s)
    end = time.monotonic() + timeout_s + 5.0
    for _ in inputs:
        if not done.acquire(timeout=max(0.0, end - time.monotonic())):
            break
    return pd.DataFrame(rows)


def _answer(result: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, key, cast in (("BATCH", "batch", int), ("PID", "pid", int),
                            ("INSTANCE", "instance", lambda v: v.decode() if isinstance(v, bytes) else str(v))):
        array = result.as_numpy(name)
        if array is not None and array.size:
            found[key] = cast(array.reshape(-1)[0])
    return found


def batch_table(server: Any, model: str, answers: pd.DataFrame,
                weights: Mapping[str, int] | None = None) -> pd.DataFrame:
    """One row per executed batch of ``answers``' requests, from the trace, in start order.

    Columns of :func:`~lab_backends.measure.batches.lanes` (``instance`` is a lane: one per busy
    instance), plus ``model_batch`` (the largest batch size a request of it reported) and, with
    ``weights`` (request id -> bytes), ``bytes``.
    """
    ok = list(answers.loc[answers["ok"], "request_id"])
    log = tracing.read_trace(tracing.trace_path(server), request_ids=ok, timeout_s=30).select(ok)
    table = lanes(compute_spans(log, model))
    reported = answers.set_index("request_id")["batch"]
    table["model_batch"] = [int(max(reported[i] for i in ids)) for ids in table["request_ids"]]
    if weights is not None:
        table["bytes"] = [int(sum(weights[i] for i in ids)) for ids in table["request_ids"]]
    return table


def _executions(server: Any, model: str) -> dict[int, int]:
    stats = server.statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


@dataclass
class Run:
    """One burst: its batches (from the trace), its answers, and ``batch_stats``' executions during it."""

    name: str
    table: pd.DataFrame
    answers: pd.DataFrame
    executions: dict[int, int]
    total_bytes: int

    def facts(self, budget: int) -> dict[str, Any]:
        listed = [rid for ids in self.table["request_ids"] for rid in ids]
        ok = set(self.answers.loc[self.answers["ok"], "request_id"])
        return {
            "requests": len(self.answers), "answered": len(ok), "batches (trace)": len(self.table),
            "executions (batch_stats)": sum(self.executions.values()),
            "rows (batch_stats)": sum(size * n for size, n in self.executions.items()),
            "largest batch (requests)": int(self.table["size"].max()),
            "largest batch (bytes)": int(self.table["bytes"].max()),
            "batches over the budget": int((self.table["bytes"] > budget).sum()),
            "fewest executions the budget allows": math.ceil(self.total_bytes / budget),
            "each request in one batch": len(listed) == len(set(listed)) and set(listed) == ok,
            "sizes agree": bool((self.table["size"] == self.table["model_batch"]).all()),
        }


def burst(server: Any, model: str, n: int, prefix: str, lengths: Sequence[int] = LENGTHS, gap_s: float = 0.0) -> Run:
    """``n`` requests of ``lengths[i % len]`` floats each, all at once (or ``gap_s`` apart), on the model
    as it is loaded now."""
    before = _executions(server, model)
    inputs = [{"INPUT0": np.full((1, lengths[i % len(lengths)]), i, dtype=np.float32)} for i in range(n)]
    answers = tagged_burst(server, model, inputs, prefix=prefix, timeout_s=60, gap_s=gap_s)
    weights = {f"{prefix}-{i}": int(x["INPUT0"].nbytes) for i, x in enumerate(inputs)}
    table = batch_table(server, model, answers, weights)
    after = _executions(server, model)
    executions = {size: after[size] - before.get(size, 0) for size in after if after[size] > before.get(size, 0)}
    return Run(prefix, table, answers, executions, sum(weights.values()))


def compare(server: Any, base: Any, library: str | Path, n: int, budget: int = BUDGET,
            model: str = MODEL) -> dict[str, Run]:
    """The same burst under the plain dynamic batcher, then with the strategy at ``budget`` bytes."""
    apply_config(server, model, without_strategy(base), base)
    run = next(_RUNS)
    plain = burst(server, model, n, f"plain{run}")
    apply_config(server, model, with_strategy(base, library, **{PARAMETER: budget}), base)
    capped = burst(server, model, n, f"budget{run}")
    return {"plain batcher": plain, f"{STRATEGY} {budget}": capped}


@dataclass(frozen=True)
class Trickle:
    """The load of :func:`trickle`: ``n`` requests of ``floats`` FP32 each, ``gap_ms`` apart, at a budget of
    ``budget`` bytes, while each batch takes ``batch_ms``.

    Why 10 ms apart: a batch grows only when a request arrives *alone* while the previous batch
    waits for the instance. At 2 ms apart, on a busy machine (two CPU burners on the 2 cores, with
    the call_log strategy), the client's sends bunched up: the batcher found two queued at once,
    refused the second, closed the batch, and in 1 run of 16 no batch grew. At 10 ms apart the
    smallest largest batch in 16 such runs held 4 requests; 50 ms per batch leaves room for several.
    """

    n: int = 24
    floats: int = 128
    gap_ms: float = 10.0
    budget: int = 64
    batch_ms: int = 50

    @property
    def request_bytes(self) -> int:
        return 4 * self.floats


TRICKLE = Trickle()


def trickle(server: Any, base: Any, library: str | Path, close_every_batch: bool, delay_us: int = 0,
            model: str = MODEL, load: Trickle = TRICKLE) -> Run:
    """Requests heavier than the budget, arriving one by one while a batch runs: each must run alone.

    While one batch runs, requests arrive one by one, so each new batch is sent with the single
    request the queue held: not closed by a refusal (nothing else was queued). Without
    :func:`every_batch_closed` the batcher keeps adding the next arrivals to it, with the strategy's
    count reset each time, and the batch grows past the budget. ``delay_us`` adds a queue delay to
    the config (with every size preferred, it brings the growth back: see :func:`every_batch_closed`).
    """
    config = with_strategy(base, library, close_every_batch, **{PARAMETER: load.budget, "fixed_ms": load.batch_ms})
    if delay_us:
        config.dynamic_batching.max_queue_delay_microseconds = delay_us
    apply_config(server, model, config, base)
    return burst(server, model, load.n, f"trickle{next(_RUNS)}", lengths=(load.floats,), gap_s=load.gap_ms / 1000)


def bytes_figure(runs: Mapping[str, Run], budget: int, ax: Any = None) -> Any:
    """Bytes of every batch, in start order, one line per run, and the budget as a dashed line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    for name, run in runs.items():
        ax.plot(range(1, len(run.table) + 1), run.table["bytes"], marker="o", markersize=3, label=name)
    ax.axhline(budget, color="black", linestyle="--", linewidth=1, label=f"budget {budget} B")
    ax.set_xlabel("batch (in start order)")
    ax.set_ylabel("input bytes")
    ax.set_title("Input bytes per batch")
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


_ALLOC = r"(?:malloc|calloc|realloc|strdup|strndup)\s*\("


def allocation_faults(source: str) -> list[str]:
    """What a strategy allocates and never frees, read from its source (a reviewer's check, not a C parser).

    Two pairs: ``ModelBatcherInitialize`` -> ``ModelBatcherFinalize`` (once per load) and
    ``ModelBatchInitialize``/``ModelBatchIncludeRequest`` -> ``ModelBatchFinalize`` (once per batch:
    a leak there grows with every batch). A finalizer must call ``free`` when its partner allocates,
    and free every field its partner fills with an allocation (``tally->tenant = strdup(...)`` needs
    ``free(tally->tenant)``), itself or through a helper function of the file that it calls.
    """
    functions = {f.name: f.code for f in c_source.c_functions(source)}
    problems = []
    pairs = (("TRITONBACKEND_ModelBatcherFinalize", ("TRITONBACKEND_ModelBatcherInitialize",), "load"),
             ("TRITONBACKEND_ModelBatchFinalize",
              ("TRITONBACKEND_ModelBatchInitialize", "TRITONBACKEND_ModelBatchIncludeRequest"), "batch"))
    for finalizer, partners, unit in pairs:
        allocating = [p for p in partners if re.search(rf"\b{_ALLOC}", functions.get(p, ""))]
        body = functions.get(finalizer, "")
        called = [code for name, code in functions.items()
                  if not name.startswith("TRITONBACKEND_") and re.search(rf"\b{re.escape(name)}\s*\(", body)]
        body = "\n".join([body, *called])
        if allocating and not re.search(r"\bfree\s*\(", body):
            problems.append(f"{finalizer} frees nothing, but {' and '.join(allocating)} "
                            f"allocate{'s' if len(allocating) == 1 else ''} memory: every {unit} leaks it")
            continue
        for partner in allocating:
            for field in re.findall(rf"->\s*(\w+)\s*=\s*(?:\([^()]*\)\s*)?{_ALLOC}", functions[partner]):
                if not re.search(rf"\bfree\s*\(\s*\w+\s*->\s*{field}\s*\)", body):
                    problems.append(f"{partner} allocates ->{field}, which {finalizer} never frees: every "
                                    f"{unit} leaks it")
    return problems
