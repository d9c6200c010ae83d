"""Notebook 03b, section 2: what a queue policy does to a burst, with the batcher stall kept out of the picture.

Each function reloads ``scheduler_probe`` with ONE instance and a queue policy, sends a burst with
:func:`~lab_backends.measure.probe_load.probe_load` and returns a :class:`PolicyBurst`: every
request's outcome, what the statistics API counted over the burst, and the served requests' trace
stamps. While the burst is answered, :func:`~lab_backends.lessons.batcher_stall.pinging` sends a
ping every 10 ms on a priority level of its own that expires it at once: with any queue policy
Triton 2.51's batcher can sleep 500 ms with requests queued and an instance idle (the notebook's
next section, :mod:`~lab_backends.lessons.batcher_stall`), and an arriving request wakes it. The
pings never run and never take a real request's place; they are counted apart.

The evidence the notebook checks does not depend on the machine's speed: Triton's own error texts,
the statistics' counts (a request refused at ``Enqueue`` never reaches them, core
``src/infer_request.cc`` 411-422 at r24.10; an expired one is a failure, ``RespondIfError`` ->
``ReportErrorStatistics``, 460-462), the failures' duration as the server measured it, and the trace's
stamps (which batch ran when, and what was queued by then).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lab_backends.lessons.batcher_stall import PingRecord, idle_gaps, pinging, with_ping_level
from lab_backends.lessons.scheduler import MODEL, reload
from lab_backends.measure import stats as _stats
from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import compute_spans
from lab_backends.measure.probe_load import probe_load

#: Instances in every burst of this section: one, the simplest picture of a queue in front of an instance.
INSTANCES = 1
FULL = "Exceeds maximum queue size"
EXPIRED = "Request timeout expired"
#: Numbers each burst's request ids (``full3-0``...): a trace read by id must not find an earlier burst's requests.
_BURSTS = itertools.count()


@dataclass(frozen=True)
class PolicyBurst:
    """One burst against a queue policy: per request, per server count, per trace stamp."""

    answers: pd.DataFrame  #: probe_load's frame: ok, error, priority, sent_s, done_s, latency_ms, ...
    spans: pd.DataFrame  #: served requests' trace stamps: request_id, priority, queue_ns, start_ns, end_ns
    counted_success: int  #: the statistics API's successes over the burst
    counted_fail: int  #: ... and failures
    expired_queue_ms: pd.Series  #: trace: each expired request's time from QUEUE_START to REQUEST_END (its error)
    longest_idle_ms: float  #: the longest time no batch ran while a request was queued (trace; 0 if never)
    pings: PingRecord  #: the pings sent while the burst was answered

    @property
    def served(self) -> int:
        return int(self.answers["ok"].sum())

    def failed_with(self, text: str) -> pd.DataFrame:
        """The requests whose error contains ``text``."""
        return self.answers[~self.answers["ok"] & self.answers["error"].str.contains(text, regex=False)]


def _burst(server: Any, base: Any, override: dict, n: int, prefix: str, priorities: Sequence[int] | None = None,
           model: str = MODEL) -> PolicyBurst:
    block, level = with_ping_level(override.pop("dynamic_batching"))
    reload(server, {"instance_group": [{"kind": "KIND_CPU", "count": INSTANCES}], "dynamic_batching": block,
                    **override}, base, model, warm=2)
    before = _stats.settled_statistics(server, model)
    prefix = f"{prefix}{next(_BURSTS)}"
    with pinging(server, model, level, prefix=f"{prefix}-ping") as pings:
        answers = probe_load(server, model, n, concurrency=n, prefix=prefix, priorities=priorities)
    a, b = _stats.totals(before, model), _stats.totals(_stats.settled_statistics(server, model), model)
    served = answers.loc[answers["ok"], "request_id"]
    expired = answers.loc[~answers["ok"] & answers["error"].str.contains(EXPIRED, regex=False), "request_id"]
    ids = pd.concat([served, expired])  # a refused request's trace never ends: it is not read
    log = tracing.read_trace(tracing.trace_path(server), request_ids=ids, timeout_s=30).select(ids)
    spans = compute_spans(log.select(served), model).merge(answers[["request_id", "priority"]], on="request_id")
    gaps = idle_gaps(spans)
    return PolicyBurst(answers, spans, b.success[0] - a.success[0], b.fail[0] - a.fail[0],
                       _queued_until_end(log.select(expired)),
                       float(gaps["idle_ms"].max()) if len(gaps) else 0.0, pings)


def _queued_until_end(log: Any) -> pd.Series:
    """Per traced request: milliseconds from its QUEUE_START to its REQUEST_END, by request id."""
    stamps = log.stamps[log.stamps["name"].isin(["QUEUE_START", "REQUEST_END"])]
    wide = stamps.pivot_table(index="trace_id", columns="name", values="ns", aggfunc="min")
    if wide.empty or not {"QUEUE_START", "REQUEST_END"} <= set(wide.columns):
        return pd.Series(dtype=float, name="queued_ms")
    ids = log.requests.set_index("trace_id")["request_id"]
    return ((wide["REQUEST_END"] - wide["QUEUE_START"]) / 1e6).rename(index=ids).rename("queued_ms")


def queue_full_burst(server: Any, base: Any, max_queue_size: int = 4, burst: int = 40, fixed_ms: float = 100.0,
                     model: str = MODEL) -> PolicyBurst:
    """A burst at a queue that holds at most ``max_queue_size`` requests (batches of up to 16, ``fixed_ms`` each).

    Some are refused only if the client sends more than the queue holds while a batch runs. With the
    model's own 10 ms a batch that took a send every 2-3 ms: a client slowed to 5 ms a send (2x the
    slowest seen in a make test run, see :func:`priority_burst`) had none refused, the server draining the
    queue as fast as it filled. 100 ms leaves 20 ms a send (forced in tests/test_batches.py).
    """
    return _burst(server, base, {"parameters": {"fixed_ms": {"string_value": str(fixed_ms)}},
                                 "dynamic_batching": {"default_queue_policy": {"max_queue_size": max_queue_size}}},
                  burst, "full", model=model)


def timeout_burst(server: Any, base: Any, timeout_ms: float = 100.0, burst: int = 24, fixed_ms: float = 40.0,
                  model: str = MODEL) -> PolicyBurst:
    """A burst, two requests per batch, ``fixed_ms`` per batch, a queue timeout of ``timeout_ms``.

    One instance serves at most 2 requests per ``fixed_ms``: with the defaults, 24 need at least
    12 x 40 = 480 ms, far longer than the timeout, so the tail of the queue expires while the head is
    served. Overrides are allowed (``allow_timeout_override``) so that a learner can try a request's
    own timeout: it only ever shortens the default (core ``src/scheduler_utils.cc`` 180-184 at r24.10).
    """
    return _burst(server, base, {"max_batch_size": 2, "parameters": {"fixed_ms": {"string_value": str(fixed_ms)}},
                                 "dynamic_batching": {"default_queue_policy": {
                                     "default_timeout_microseconds": int(timeout_ms * 1000),
                                     "allow_timeout_override": True}}},
                  burst, "timeout", model=model)


def priority_burst(server: Any, base: Any, burst: int = 24, fixed_ms: float = 200.0, model: str = MODEL) -> PolicyBurst:
    """A burst, two requests per batch: the first half at the default level 2, then the second half at level 1 (high).

    ``fixed_ms`` per batch is long next to the few milliseconds the burst takes to send, so every
    request is queued before the first batch ends: from the second batch on, the batcher chooses
    among all of them. 40 ms was not: in a make test run (3 server-test workers, tests/class beside
    them) 16 requests took longer than that to be queued, and ``queued_before_first_end`` failed.
    """
    half = burst // 2
    return _burst(server, base, {"max_batch_size": 2, "parameters": {"fixed_ms": {"string_value": str(fixed_ms)}},
                                 "dynamic_batching": {"priority_levels": 2, "default_priority_level": 2}},
                  burst, "priority", priorities=[2] * half + [1] * (burst - half), model=model)


def priority_order(run: PolicyBurst) -> dict[str, Any]:
    """What the trace says about the order of a :func:`priority_burst`, as facts a notebook can check.

    * ``first_wave``: requests whose batch started before any batch had ended: the batcher sent them
      while the burst was still arriving (one batch per idle instance: the first batch, with one),
      before it could choose;
    * ``queued_before_first_end``: every request was queued (``QUEUE_START``) before the first batch
      ended, so every later batch was formed with the whole burst in the queue;
    * ``passed_over``: priority-1 requests (after the first wave) that started computing after a
      priority-2 request (after the first wave) had already finished. The batcher takes level 1
      first (``PriorityQueue``, core ``src/scheduler_utils.cc`` 407-424 at r24.10), so a batch with a
      level-2 request is formed after the last level-1 one; one instance runs batches in the order
      they were formed, so this is 0. (With several instances, two batches formed together could
      start in either order: the check would need a margin.)
    """
    spans = run.spans
    first_end = spans["end_ns"].min()
    wave = spans["start_ns"] < first_end
    rest = spans[~wave]
    high, low = rest[rest["priority"] == 1], rest[rest["priority"] == 2]
    passed = int((high["start_ns"] > low["end_ns"].min()).sum()) if len(high) and len(low) else 0
    order = rest.sort_values("start_ns")["priority"].tolist()
    return {"first_wave": int(wave.sum()), "first_wave_priorities": sorted(spans.loc[wave, "priority"].tolist()),
            "queued_before_first_end": bool(spans["queue_ns"].max() < first_end), "passed_over": passed,
            "order_after_first_wave": "".join(str(p) for p in order)}


def latency_by_priority(run: PolicyBurst) -> pd.DataFrame:
    """Client latency per priority level: count, min, median, max (ms)."""
    return run.answers.groupby("priority")["latency_ms"].describe()[["count", "min", "50%", "max"]].round(1)


def expired_summary(run: PolicyBurst) -> dict[str, float]:
    """When the expired requests came back, and how long the served ones waited in the queue (trace)."""
    late = run.failed_with(EXPIRED)
    waits = (run.spans["start_ns"] - run.spans["queue_ns"]) / 1e6
    return {"expired_first_ms": float(late["done_s"].min() * 1000) if len(late) else np.nan,
            "expired_last_ms": float(late["done_s"].max() * 1000) if len(late) else np.nan,
            "expired_min_latency_ms": float(late["latency_ms"].min()) if len(late) else np.nan,
            "expired_min_queue_ms": float(run.expired_queue_ms.min()) if len(run.expired_queue_ms) else np.nan,
            "served_longest_queue_ms": float(waits.max()) if len(waits) else np.nan}
