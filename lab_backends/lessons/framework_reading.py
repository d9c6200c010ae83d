"""Notebook 05's readings: what this run's own numbers say, as tables and printed sentences.

Every comparative sentence notebook 05 prints comes from here, computed from the measurement it
describes, so a run that measures otherwise also says otherwise (no prose claim a run can contradict).

**What ``compute_infer`` holds for a Python-backend model.** The backend copies the batch's inputs
into the stub's shared memory, *then* starts its compute clock, sends the batch to the stub, waits
for the stub's answer, and stops the clock once the answer is back (python_backend
``src/python_be.cc`` L1319-1353 at r24.10: ``SaveRequestsToSharedMemory``, ``compute_start_ns``,
``StubMessageQueue()->Push``, ``ReceiveMessageFromStub``, ``compute_end_ns``). In between, the stub
loads the requests, calls ``execute`` and stores the responses in shared memory (``src/pb_stub.cc``
L652-697). So a Python model's ``compute_infer`` = the hand-off to the stub and back + ``model.py``'s
own Python + the framework call. The statistics have no stamp around the framework call alone:
:func:`where_time_goes` puts beside them the same file timed in this process
(:func:`~lab_backends.lessons.frameworks.thread_timings`, batch 1, one thread, as ``model.py`` pins
it): an estimate from another process, labelled as such.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import pandas as pd

from lab_backends.lessons import frameworks
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.running import RunningServer

#: A 2-thread/1-thread time ratio within this distance of 1 is read as "no difference".
SAME_WITHIN = 0.1


def batcher_delay_ms(server: RunningServer, model: str) -> float:
    """The model's ``dynamic_batching { max_queue_delay_microseconds }``, in ms, from the served config."""
    return server.model_config(model).dynamic_batching.max_queue_delay_microseconds / 1000


def artifact_mb(models: Sequence[str]) -> pd.Series:
    """MB (2**20 bytes) of the files each model serves from its version folder, ``model.py`` aside.

    ``model.pt``, ``model.onnx``, or the ``model.savedmodel`` directory: the weights as the framework
    reads them (local model repository; the same files the server loads).
    """
    sizes = {}
    for model in models:
        files = [p for p in (MODEL_REPOSITORY / model / "1").rglob("*")
                 if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
        sizes[model] = sum(p.stat().st_size for p in files) / 2**20
    return pd.Series(sizes, name="weights_mb")


def footprint_lines(costs: pd.DataFrame, weights_mb: pd.Series) -> list[str]:
    """Per model: weights on disk against the stub's resident memory; and what a second instance costs."""
    rss = costs["rss_mb_per_instance"]
    lines = [f"{model}: weights {weights_mb[model]:.1f} MB on disk, stub {rss[model]:.0f} MB resident "
             f"({rss[model] - weights_mb[model]:.0f} MB more than its weights)" for model in costs.index]
    heavy = rss.idxmax()
    lines.append(f"one instance = one stub: {heavy} with instance_group {{ count: 2 }} would hold two stubs "
                 f"of ~{rss[heavy]:.0f} MB, ~{2 * rss[heavy]:.0f} MB before any request")
    return lines


def where_time_goes(frame: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """One request alone, split: client-side mean latency and the server's mean stages, in ms.

    ``frame``: :func:`frameworks.side_by_side` (its lowest concurrency is read); ``calls``:
    :func:`frameworks.thread_timings` with a 1-thread, batch-1 row per framework (its median call; none
    for TensorFlow: NaN). ``outside_server_ms`` is the client, the network and the front end before and after the
    server's request (mean latency minus the server's mean request time); ``stub_and_model_py_ms``
    is compute_infer minus the framework call timed alone (the hand-off and model.py's Python).
    """
    alone = frame[frame["concurrency"] == frame["concurrency"].min()].set_index("config")
    one = calls[(calls["threads"] == 1) & (calls["batch"] == 1)].set_index("framework")["us_median"] / 1000
    out = pd.DataFrame(index=alone.index)
    out["latency_ms"] = alone["mean_ms"]
    out["outside_server_ms"] = alone["mean_ms"] - alone["server_server_ms"]
    out["queue_ms"] = alone["server_queue_ms"]
    out["compute_input_ms"] = alone["server_compute_input_ms"]
    out["compute_infer_ms"] = alone["server_compute_infer_ms"]
    out["framework_call_ms"] = [float(one.get(frameworks.framework_of(m), math.nan)) for m in out.index]
    out["stub_and_model_py_ms"] = out["compute_infer_ms"] - out["framework_call_ms"]
    out["compute_output_ms"] = alone["server_compute_output_ms"]
    out["compute_infer_share"] = out["compute_infer_ms"] / out["latency_ms"]
    out["framework_share"] = out["framework_call_ms"] / out["latency_ms"]
    return out


def time_lines(split: pd.DataFrame) -> list[str]:
    """What :func:`where_time_goes` measured, one sentence per model and one across them."""
    lines = []
    for model, r in split.iterrows():
        line = (f"{model}: mean request {r.latency_ms:.2f} ms; queue {r.queue_ms:.2f} ms "
                f"({r.queue_ms / r.latency_ms:.0%}); "
                f"compute_infer {r.compute_infer_ms:.2f} ms ({r.compute_infer_share:.0%})")
        if math.isnan(r.framework_call_ms):
            line += "; its framework call is not timed alone here"
        else:
            line += (f", of which the framework call, timed alone in this kernel, ~{r.framework_call_ms:.2f} ms "
                     f"({r.framework_share:.0%} of the request)")
            if r.stub_and_model_py_ms < 0:
                line += (": more than compute_infer itself, so this in-kernel timing ran slower than the stub's "
                         "(two processes, two moments): read both as estimates")
        lines.append(line)
    timed = split["framework_share"].dropna()
    if len(timed):
        infer = split["compute_infer_share"]
        lines.append(f"with one request in flight, the framework call took {timed.min():.0%}-{timed.max():.0%} "
                     f"of a request here ({', '.join(timed.index)}), compute_infer {infer.min():.0%}-{infer.max():.0%}")
    slowest, fastest = split["latency_ms"].max(), split["latency_ms"].min()
    lines.append(f"the slowest framework's mean request ({split['latency_ms'].idxmax()}, {slowest:.2f} ms) took "
                 f"{slowest / fastest:.2f}x the fastest's ({split['latency_ms'].idxmin()}, {fastest:.2f} ms)")
    return lines


def batching_lines(frame: pd.DataFrame) -> list[str]:
    """Per model: throughput and batch size at the busiest point against one request in flight."""
    low, top = frame["concurrency"].min(), frame["concurrency"].max()
    alone = frame[frame["concurrency"] == low].set_index("config")
    busy = frame[frame["concurrency"] == top].set_index("config")
    lines = [f"{model}: {busy.loc[model, 'throughput_rps']:.0f} req/s with {top} in flight (avg batch "
             f"{busy.loc[model, 'avg_batch']:.1f}) against {alone.loc[model, 'throughput_rps']:.0f} req/s with {low}: "
             f"{busy.loc[model, 'throughput_rps'] / alone.loc[model, 'throughput_rps']:.1f}x" for model in busy.index]
    best, worst = busy["throughput_rps"].idxmax(), busy["throughput_rps"].idxmin()
    ratio = busy.loc[best, "throughput_rps"] / busy.loc[worst, "throughput_rps"]
    lines.append(f"with {top} in flight {best} served {ratio:.2f}x the requests per second of {worst}")
    return lines


def thread_lines(table: pd.DataFrame, same_within: float = SAME_WITHIN) -> list[str]:
    """One verdict per (framework, batch) row of the 2-thread/1-thread ratio column: helped, cost, or same."""
    lines = []
    for (framework, batch), ratio in table["2 threads / 1 thread"].items():
        if ratio < 1 - same_within:
            verdict = f"the second thread helped: {1 / ratio:.1f}x faster"
        elif ratio > 1 + same_within:
            verdict = f"the second thread cost time: {ratio:.1f}x slower"
        else:
            verdict = f"no difference beyond ±{same_within:.0%}"
        lines.append(f"{framework}, batch {batch}: 2 threads took {ratio:.2f}x the time of 1: {verdict}")
    return lines


def busy_again(server: RunningServer, models: Sequence[str], concurrency: int,
               duration_s: float) -> Callable[[float], pd.DataFrame]:
    """The busiest windows of :func:`frameworks.side_by_side` again, ``factor`` times longer.

    The ``remeasure`` of notebook 05's batching claim (``check_measured``): it runs only when the
    first measurement missed, so it is a function here, where a test can run it.
    """
    return lambda factor: frameworks.side_by_side(server, models, concurrencies=(concurrency,),
                                                  duration_s=duration_s * factor)
