"""Several sequences of a stateful model at once, and what the sequence batcher made of them.

* :func:`drive_concurrent`: one thread per sequence (each with its own gRPC client), all released
  together: with the ``oldest`` strategy requests of different sequences share an ``execute`` (a
  batch), which the statistics of the same window show;
* :func:`fill_slots`: more sequences than the batcher has *sequence slots*, started at once and
  left open: which ones are answered, which wait in the backlog, and what ending one changes.

How many sequences can be open at once (Triton core ``src/sequence_batch_scheduler/
sequence_batch_scheduler.cc`` at r24.10): each model *instance* gets its own batcher with
``max(1, max_batch_size)`` slots, or ``oldest.max_candidate_sequences`` slots when the ``oldest``
strategy sets it (lines 160-171, 294-323), so ``max_batch_size: 0`` does not mean one sequence at a
time under ``oldest``. A sequence that starts while every slot is taken waits, unanswered, in a
backlog (806-839) and takes the next slot an ended sequence frees (915-978). :func:`sequence_slots`
computes that number from a config; :func:`fill_slots` measures it.

Lives in the measure layer because it reads the statistics.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import tritonclient.grpc as grpcclient

from lab_backends.client.sequences import MODEL, check_sequences, expected_means, step
from lab_backends.errors import SequenceError
from lab_backends.measure import stats as _stats
from lab_backends.measure.stats import settled_statistics
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll


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
    check_sequences(sequences)
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


# ---------------------------------------------------------------------------- sequence slots


def sequence_slots(config: Any) -> int:
    """How many sequences ``config`` lets the sequence batcher hold open at once (KIND_CPU groups).

    Per instance ``max(1, max_batch_size)``, replaced by ``oldest.max_candidate_sequences`` when the
    ``oldest`` strategy sets it (sequence_batch_scheduler.cc 160-171 at r24.10); one batcher per
    instance (294-323), so the instance counts multiply.
    """
    per_instance = max(1, int(config.max_batch_size))
    batching = config.sequence_batching
    if batching.HasField("oldest") and batching.oldest.max_candidate_sequences > 0:
        per_instance = int(batching.oldest.max_candidate_sequences)
    instances = sum(max(1, int(group.count)) for group in config.instance_group) or 1
    return instances * per_instance


def without_batching(config: Any) -> Any:
    """A config override for ``running_mean``: ``max_batch_size: 0``, nothing else lost.

    Two things must change with it, or Triton refuses the load / the requests: the ``oldest``
    preferred batch sizes (filled in as ``[max_batch_size]`` when the config gave none; they must
    not exceed it) go, and every tensor gets the batch dimension into its ``dims`` (``[1]`` ->
    ``[1, 1]``), so requests keep the shape ``[1, 1]`` they had. Use with
    :func:`lab_backends.server.config_changes.apply_config`.
    """
    if config.max_batch_size > 0:
        for tensor in list(config.input) + list(config.output):
            tensor.dims.insert(0, 1)
    config.max_batch_size = 0
    if config.sequence_batching.HasField("oldest"):
        del config.sequence_batching.oldest.preferred_batch_size[:]
    return config


@dataclass
class SlotProbe:
    """What :func:`fill_slots` saw. Correlation IDs are listed in the order they were started."""

    slots: int                     #: what the config gives (:func:`sequence_slots`)
    started: list[int]             #: sequences whose START was sent at once, none ended
    answered: list[int]            #: ... whose START was answered while all of them were open
    waiting: list[int]             #: ... whose START got no answer: in the backlog
    executed: int                  #: requests the model ran meanwhile (statistics), the probe included
    probe_answered: bool           #: a later request of an answered sequence was answered meanwhile
    freed: int | None = None       #: the answered sequence then ended, to free its slot
    admitted: list[int] = field(default_factory=list)  #: waiting sequences answered after that END

    @property
    def frame(self) -> pd.DataFrame:
        """One row per started sequence: its START answered at once, after the END, or never."""
        def when(corrid: int) -> str:
            if corrid in self.answered:
                return "at once"
            return "after an END freed a slot" if corrid in self.admitted else "not answered"
        return pd.DataFrame({"corrid": self.started, "START answered": [when(c) for c in self.started]})


def fill_slots(
    server: RunningServer, extra: int = 1, model: str = MODEL, first_corrid: int = 7001,
    settle_s: float = 0.3, timeout_s: float = 20.0,
) -> SlotProbe:
    """Start ``sequence_slots + extra`` sequences at once and end none: which are answered?

    Each START is sent from its own thread (and gRPC client). Once as many as there are slots are
    answered and ``settle_s`` more has passed, one answered sequence is sent a second value: that
    later request is answered while the ``extra`` STARTs are not (they wait in the backlog, and the
    statistics count no execution for them). Then that sequence is ended, which frees its slot for
    a waiting one. Every sequence is ended before returning, whatever happened, so no slot stays
    taken. ``timeout_s`` bounds each wait; a sequence left idle ``max_sequence_idle_microseconds``
    (30 s for ``running_mean``) would lose its slot, so keep it below that.
    """
    slots = sequence_slots(server.model_config(model))
    corrids = list(range(first_corrid, first_corrid + slots + extra))
    check_sequences({c: [1.0] for c in corrids})
    clients = {c: grpcclient.InferenceServerClient(server.grpc_url) for c in corrids}
    pool = ThreadPoolExecutor(len(corrids), thread_name_prefix="slot")

    def send(corrid: int, value: float, start: bool = False, end: bool = False) -> Future:
        return pool.submit(step, server, corrid, value, start, end, client=clients[corrid], model=model)

    ends: list[Future] = []
    starts: dict[int, Future] = {}
    freed = None
    try:
        before = settled_statistics(server, model)
        starts = {c: send(c, 1.0, start=True) for c in corrids}
        poll(lambda: sum(f.done() for f in starts.values()), lambda n: n >= slots, timeout_s)
        time.sleep(settle_s)
        answered = [c for c in corrids if starts[c].done()]
        probe_answered = False
        if answered:
            send(answered[0], 3.0).result(timeout=timeout_s)  # sent after every START, answered first
            probe_answered = True
        waiting = [c for c in corrids if not starts[c].done()]  # still unanswered after that
        answered = [c for c in corrids if c not in waiting]
        executed = _stats.window(before, settled_statistics(server, model), model).requests
        probe = SlotProbe(slots, corrids, answered, waiting, executed, probe_answered)
        if answered and waiting:
            probe.freed = freed = answered[0]
            ends.append(send(freed, 0.0, end=True))
            poll(lambda: [c for c in waiting if starts[c].done()], bool, timeout_s)
            probe.admitted = [c for c in waiting if starts[c].done()]
    finally:
        # End every sequence still open (a backlogged one ends once it gets a slot), so the
        # slots are free for whatever runs next.
        ends += [send(corrid, 0.0, end=True) for corrid in corrids if corrid != freed]
        for future in ends:
            try:
                future.result(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a sequence that never started has nothing to end
                pass
        # A START answered just before its END may not be marked done yet: its thread had not run
        # when the END's did (CI saw that once under load). Wait for every START, within the bound.
        wait(starts.values(), timeout=timeout_s)
        pool.shutdown(wait=False)
        for client in clients.values():
            client.close()
    failed = {c: f.exception() if f.done() else "no answer" for c, f in starts.items()
              if not f.done() or f.exception() is not None}
    if failed:
        raise SequenceError(f"the START of {len(failed)} sequence(s) failed: {failed}")
    return probe
