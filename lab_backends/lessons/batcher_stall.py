"""Triton 2.51's half-second batcher stall (notebook 03b), measured from the trace, and the pings that prevent it.

What happens, in core at r24.10:

* any queue policy (``max_queue_size``, a timeout, ``allow_timeout_override``) or priority levels
  turns off the batcher's *prefetching* (``src/scheduler_utils.cc`` 364-375);
* without prefetching the batcher forms a batch only when an instance's backend thread is *waiting
  for work*: ``RateLimiter::PayloadSlotAvailable`` asks ``WaitingConsumerCount() > 0``
  (``src/rate_limiter.cc`` 230-234). A backend thread counts itself waiting when it enters
  ``DequeuePayload`` (``rate_limiter.cc`` 317), after ``execute()`` returned and its payload was
  released (``src/backend_model_instance.cc`` 796-805);
* the batcher waits for that in ``WaitForPayloadSlotAvailable`` on its own condition variable
  ``cv_``, 500 ms at a time (``src/dynamic_batch_scheduler.cc`` 329, 450-468). ``cv_`` is notified by
  the payload's callback (set at 430-432), called when an instance takes the payload
  (``rate_limiter.cc`` 354-355) and when ``execute()`` has completed (``src/payload.cc`` 214-216):
  both *before* that instance counts itself waiting again. Counting itself waiting notifies another
  condition variable, the instance queue's ``waiting_consumer_cv_`` (``src/instance_queue.cc``
  106-114), which this batcher does not wait on. A new request notifies ``cv_`` when an instance is
  waiting (``Enqueue``, ``dynamic_batch_scheduler.cc`` 263-286), but a burst has none left to send;
* so when the batcher checks before the backend thread is back in ``DequeuePayload`` (a race),
  nothing wakes it: it sleeps to the deadline ``wait_for`` set when it began to wait, 500 ms after
  it sent the previous batch (or after the first batch ended, if the queue was empty then), while
  requests wait and the instance idles. At the deadline the instance is free, the predicate holds
  and the batcher forms the next batch; requests whose queue timeout ran out meanwhile are rejected
  then, all together (``GetDynamicBatch`` -> ``ApplyPolicyAtCursor``, 511; sent at 383-384, 441-442).

Two instances make it rarer (each one's callbacks can wake the batcher for the other), not
impossible: two batches that end together can both lose the race. Without a policy, prefetching asks
only that fewer than two payloads be queued (``rate_limiter.cc`` 213-229), which an instance's
dequeue changes before its callback runs. What prevents it is an arrival: :func:`pinging` sends
one request every few milliseconds, at a priority level whose queue policy expires it before it can
run (:func:`with_ping_level`), so the stall cannot outlast a ping interval.

The evidence here is the trace, not the client's clock: a gap in which no batch ran while a request
was already queued (:func:`idle_gaps`), and how long after the previous batch started it ended.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
import tritonclient.grpc as grpcclient

from lab_backends.client.infer import make_inputs
from lab_backends.lessons.scheduler import reload
from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import compute_spans
from lab_backends.measure.probe_load import probe_load
from lab_backends.notebook import forced_remeasure

MODEL = "scheduler_probe"
#: The batcher's wait for a free instance: ``default_wait_microseconds`` (dynamic_batch_scheduler.cc 329).
BATCHER_WAIT_MS = 500.0
#: An idle gap (a request waiting, nothing running) at least this long is a stall: half the batcher's
#: wait, and far longer than any gap between batches of a healthy burst (about a millisecond here).
STALL_IDLE_MS = 250.0
#: One policy that turns prefetching off and changes nothing else for a burst of 12 (nothing is refused).
POLICY = {"default_queue_policy": {"max_queue_size": 100}}
#: The configs :func:`stall_report` compares: (instances, dynamic_batching, pings while a burst runs).
CONFIGS: dict[str, tuple[int, Mapping[str, Any], bool]] = {
    "1 instance, no queue policy": (1, {}, False),
    "1 instance, max_queue_size 100": (1, POLICY, False),
    "2 instances, max_queue_size 100": (2, POLICY, False),
    "1 instance, max_queue_size 100, pings": (1, POLICY, True),
}
#: The config that shows the stall: :func:`stall_report` re-measures it while none is seen.
STALLING = "1 instance, max_queue_size 100"
GAP_COLUMNS = ["at_ms", "idle_ms", "since_batch_start_ms", "stall"]
#: One ping every this many milliseconds while a burst is answered (:func:`pinging`).
PING_EVERY_MS = 10.0
#: A ping's level expires a request this long after it is queued: before the batcher can take it.
PING_TIMEOUT_US = 1
#: Numbers each series of bursts: a trace read by request id must not find an earlier series' requests.
_SERIES = itertools.count()


def idle_gaps(spans: pd.DataFrame) -> pd.DataFrame:
    """Every moment of one burst when no batch ran although a request was already queued.

    ``spans`` is :func:`~lab_backends.measure.batches.compute_spans` of the burst's served requests
    (``queue_ns, start_ns, end_ns``; the requests of one batch share their compute stamps). A gap
    runs from the end of the last batch running to the start of the next one; it counts only if a
    request queued before it began ran after it. ``since_batch_start_ms`` is the time from the start
    of the batch sent before the gap to the start of the one after it: the batcher's 500 ms wait is
    counted from about when it sent that batch. ``at_ms`` is from the burst's first queued request.
    """
    if spans.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    runs = spans.groupby(["start_ns", "end_ns"], as_index=False).size().sort_values("start_ns")
    origin = int(spans["queue_ns"].min())
    rows = []
    busy_until, last_start = None, None
    for start, end in zip(runs["start_ns"], runs["end_ns"]):
        if busy_until is not None and start > busy_until:
            waiting = ((spans["queue_ns"] < busy_until) & (spans["start_ns"] >= start)).any()
            if waiting:
                idle = (start - busy_until) / 1e6
                rows.append({"at_ms": (busy_until - origin) / 1e6, "idle_ms": idle,
                             "since_batch_start_ms": (start - last_start) / 1e6, "stall": idle >= STALL_IDLE_MS})
        busy_until = end if busy_until is None else max(busy_until, end)
        last_start = start
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def with_ping_level(dynamic_batching: Mapping[str, Any]) -> tuple[dict, int]:
    """``dynamic_batching`` with one more, lowest, priority level for pings: (the new block, that level).

    The pings' level has a queue policy of its own that expires a request :data:`PING_TIMEOUT_US`
    after it is queued (``priority_queue_policy``, common ``protobuf/model_config.proto`` 1155-1188 at
    r24.10). Each level is a queue of its own with its own ``max_queue_size`` (core
    ``src/scheduler_utils.cc`` 170-176 and 381-405), so pings never take a real request's place; the
    real requests keep the levels (and the default level) they had: a config without priority levels
    gets level 1 for them, as its default.
    """
    block = dict(dynamic_batching)
    levels = int(block.get("priority_levels", 0))
    if levels == 0:
        block["default_priority_level"] = 1
    level = max(levels, 1) + 1
    block["priority_levels"] = level
    policies = dict(block.get("priority_queue_policy", {}))
    policies[str(level)] = {"default_timeout_microseconds": PING_TIMEOUT_US}
    block["priority_queue_policy"] = policies
    return block, level


@dataclass
class PingRecord:
    """The pings one :func:`pinging` sent, and how Triton answered them."""

    sent: int = 0
    expired: int = 0  #: answered "Request timeout expired": expired in the queue, never ran
    other: list[str] = field(default_factory=list)  #: any other answer ("served" if one ever ran)


@contextlib.contextmanager
def pinging(server: Any, model: str, level: int, every_ms: float = PING_EVERY_MS, prefix: str = "ping",
            inputs: Mapping[str, np.ndarray] | None = None, wait_s: float = 10.0) -> Iterator[PingRecord]:
    """While the ``with`` block runs, send ``model`` one request every ``every_ms`` at priority ``level``.

    Why: a request that arrives while an instance is waiting for work wakes the batcher
    (``DynamicBatchScheduler::Enqueue``, core ``src/dynamic_batch_scheduler.cc`` 263-286 at r24.10),
    so the stall of this module cannot outlast a ping interval. On a level made by
    :func:`with_ping_level` a ping expires before the batcher can take it: it never runs, and comes
    back as "Request timeout expired" (a failure in the model's statistics). On leaving, waits up
    to ``wait_s`` for every ping's answer (expired pings are answered when the batcher next looks at
    their level). Sent from a client of its own, on a thread of its own.
    """
    record, stop, lock = PingRecord(), threading.Event(), threading.Lock()
    answered = threading.Semaphore(0)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensors = make_inputs(inputs if inputs is not None else {"INPUT0": np.zeros((1, 4), np.float32)})

    def done(result: Any, error: Any) -> None:
        with lock:
            if error is not None and "Request timeout expired" in str(error):
                record.expired += 1
            else:
                record.other.append("served" if error is None else str(error))
        answered.release()

    def send() -> None:
        while not stop.is_set():
            client.async_infer(model, tensors, done, request_id=f"{prefix}-{record.sent}", priority=level)
            record.sent += 1
            stop.wait(every_ms / 1000.0)

    thread = threading.Thread(target=send, name="pings", daemon=True)
    thread.start()
    try:
        yield record
    finally:
        stop.set()
        thread.join()
        for _ in range(record.sent):
            if not answered.acquire(timeout=wait_s):
                break
        client.close()


@dataclass(frozen=True)
class StallReport:
    """What :func:`stall_report` measured: one row per config, and every idle gap it found."""

    table: pd.DataFrame  #: per config: bursts, batches, gaps with a request waiting, stalls, longest idle, spans
    gaps: pd.DataFrame  #: config, burst and :data:`GAP_COLUMNS` of every gap with a request waiting
    rounds: int  #: rounds of ``bursts`` run for :data:`STALLING` (re-measured while no stall)


def measure(server: Any, base: Any, instances: int, dynamic_batching: Mapping[str, Any], bursts: int = 8,
            burst: int = 12, pings: bool = False, prefix: str = "stall",
            model: str = MODEL) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``bursts`` bursts of ``burst`` requests, two per batch: (one row per burst, its idle gaps).

    The model is reloaded once with ``instances`` instances, ``max_batch_size: 2`` and
    ``dynamic_batching``, warmed up by Triton during the load (``model_warmup``: no client request
    goes through the queue before the bursts). With ``pings``, each burst runs inside
    :func:`pinging`, on a level added by :func:`with_ping_level`. The server must write a trace,
    one file per request.
    """
    block, level = with_ping_level(dynamic_batching) if pings else (dict(dynamic_batching), 0)
    reload(server, {"instance_group": [{"kind": "KIND_CPU", "count": instances}], "max_batch_size": 2,
                    "dynamic_batching": block}, base, model, warm=2)
    prefix = f"{prefix}{next(_SERIES)}"
    answers, records = [], []
    for i in range(bursts):
        with pinging(server, model, level, prefix=f"{prefix}-ping-{i}") if pings else contextlib.nullcontext(
                PingRecord()) as record:
            answers.append(probe_load(server, model, burst, concurrency=burst, prefix=f"{prefix}-{i}"))
        records.append(record)
    served = pd.concat([a.loc[a["ok"], "request_id"] for a in answers])
    log = tracing.read_trace(tracing.trace_path(server), request_ids=served, timeout_s=30).select(served)
    spans = compute_spans(log, model)
    rows, gaps = [], []
    for i, a in enumerate(answers):
        mine = spans[spans["request_id"].str.startswith(f"{prefix}-{i}-")]
        found = idle_gaps(mine).assign(burst=i)
        gaps.append(found)
        rows.append({"burst": i, "served": int(a["ok"].sum()),
                     "batches": int(mine.groupby(["start_ns", "end_ns"]).ngroups),
                     "gaps_waiting": len(found), "stalls": int(found["stall"].sum()),
                     "span_ms": (mine["end_ns"].max() - mine["queue_ns"].min()) / 1e6,
                     "pings": records[i].sent, "pings_expired": records[i].expired})
    return pd.DataFrame(rows), pd.concat(gaps, ignore_index=True)


def stall_report(server: Any, base: Any, bursts: int = 8, burst: int = 12, rounds: int = 3,
                 model: str = MODEL) -> StallReport:
    """The same bursts on each of :data:`CONFIGS`; :data:`STALLING` is re-measured while no stall shows.

    The stall is a race, so a round of ``bursts`` can miss it: that config runs up to ``rounds``
    rounds until one stall is seen (``LAB_FORCE_REMEASURE=1`` forces a second round, so that tests
    run this branch). Stalls of the other configs are counted over the bursts they ran once.
    """
    tables, all_gaps, used = [], [], 0
    for name, (instances, batching, pings) in CONFIGS.items():
        keep_going = name == STALLING
        done = 0
        while True:
            per_burst, gaps = measure(server, base, instances, batching, bursts, burst, pings, model=model)
            tables.append(per_burst.assign(config=name))
            all_gaps.append(gaps.assign(config=name))
            done += 1
            missed = per_burst["stalls"].sum() == 0 or (forced_remeasure() and done == 1)
            again = keep_going and done < rounds and missed
            if not again:
                break
        if keep_going:
            used = done
    runs = pd.concat(tables, ignore_index=True)
    gaps = pd.concat(all_gaps, ignore_index=True)
    table = runs.groupby("config", sort=False).agg(
        bursts=("burst", "size"), batches=("batches", "sum"), gaps_with_a_request_waiting=("gaps_waiting", "sum"),
        stalls=("stalls", "sum"), median_burst_ms=("span_ms", "median"), longest_burst_ms=("span_ms", "max"),
        pings=("pings", "sum"), pings_expired=("pings_expired", "sum"))
    longest = gaps.groupby("config", sort=False)["idle_ms"].max()
    table["longest_idle_ms"] = longest.reindex(table.index).fillna(0.0)
    return StallReport(table.round(1), gaps[["config", "burst", *GAP_COLUMNS]], used)
