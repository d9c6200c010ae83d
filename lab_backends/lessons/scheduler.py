"""The experiments of ``03b_inside_the_scheduler``: one function per question, each on a real server.

Each one reloads ``scheduler_probe`` with a config derived from the shipped one (an override
replaces the whole config, so :func:`~lab_backends.server.config_changes.apply_config` derives it), has
Triton warm the new instances up during the load (``model_warmup``: a fresh stub's first ``execute``
is slow and would blur the picture), sends a bounded load with :func:`~lab_backends.measure.probe_load.probe_load`
and returns what it saw as pandas frames, so the notebook only shows and checks. The queue-policy
bursts are in :mod:`~lab_backends.lessons.queue_policy_lesson`, the batcher stall in
:mod:`~lab_backends.lessons.batcher_stall`, the warm-up in :mod:`~lab_backends.lessons.warmup_lesson`.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
from google.protobuf import json_format

from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import batches, compute_spans, overlapping_pairs, timeline_facts
from lab_backends.measure.probe_load import probe_load
from lab_backends.server import processes
from lab_backends.server.config_changes import apply_config, derive_config
from lab_backends.server.warmup import with_warmup
from lab_backends.waiting import poll

MODEL = "scheduler_probe"


def reload(server: Any, override: Mapping[str, Any], base: Any, model: str = MODEL, warm: int = 0) -> Any:
    """Reload ``model`` with ``override`` on ``base``; with ``warm``, each instance first runs ``warm`` requests.

    The warm-up is Triton's own (``model_warmup``, :func:`~lab_backends.server.warmup.with_warmup`):
    each instance executes it during the load, before READY, without the scheduler's queue. A
    client-side warm-up would go through the queue policy that some experiments set (a 100 ms
    timeout, a queue of 4) and could expire by chance: a request cannot ask for a longer timeout
    than the policy's (core ``src/scheduler_utils.cc`` 180-184 at r24.10), and the batcher can
    stall 0.5 s with a policy (:mod:`~lab_backends.lessons.batcher_stall`). A warm-up that fails
    fails the load, with Triton's reason (:class:`~lab_backends.errors.ModelLoadError`).
    """
    config = derive_config(base, dict(override))
    if warm:
        config = with_warmup(config, warm)
    return apply_config(server, model, config, base)


def batch_timeline(server: Any, base: Any, instances: int, n: int = 150, concurrency: int = 12,
                   model: str = MODEL) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Run ``n`` requests on ``instances`` instances; the batches (from the trace), the answers, the facts.

    The server must write a trace (``trace_file=...``, ``trace_log_frequency=1`` to read it while
    it runs); only this run's requests are kept, by their ``request_id`` prefix, new for every run:
    the trace file keeps every earlier run's records (a re-run cell, a claim's re-measurement), and
    two runs under one prefix would mix their batches.
    """
    reload(server, {"instance_group": [{"kind": "KIND_CPU", "count": instances}]}, base, model, warm=2)
    prefix = f"timeline{instances}-{uuid.uuid4().hex[:8]}"
    answers = probe_load(server, model, n, concurrency=concurrency, prefix=prefix)
    ok = answers.loc[answers["ok"], "request_id"]
    log = tracing.read_trace(tracing.trace_path(server), request_ids=ok, timeout_s=30).select(ok)
    table = batches(compute_spans(log, model), answers)
    return table, answers, timeline_facts(table, answers)


def average_batches(server: Any, base: Any, instances: tuple[int, ...] = (2, 3), n: int = 150,
                    concurrency: int = 12, model: str = MODEL) -> dict[int, float]:
    """The average batch size on each instance count, one :func:`batch_timeline` run each (what 03b
    compares, and re-measures when a busy machine made the comparison miss)."""
    return {k: batch_timeline(server, base, k, n, concurrency, model)[2]["avg_batch"] for k in instances}


def outcome(answers: pd.DataFrame) -> pd.DataFrame:
    """Served vs refused, with Triton's message (request ids cut out, so equal messages group)."""
    errors = answers["error"].str.replace(r"\[request id: [^\]]*\]\s*", "", regex=True)
    frame = answers.assign(outcome=errors.where(~answers["ok"], "served"))
    return frame.groupby("outcome").agg(requests=("request_id", "size"), first_done_ms=("done_s", "min"),
                                        last_done_ms=("done_s", "max")).assign(
        first_done_ms=lambda f: (f["first_done_ms"] * 1000).round(1),
        last_done_ms=lambda f: (f["last_done_ms"] * 1000).round(1))


RAGGED_MODEL = "ragged_probe"


def ragged_burst(server: Any, base: Any, ragged: bool, burst: int = 24, lengths: tuple[int, ...] = (3, 5, 7),
                 model: str = RAGGED_MODEL) -> pd.DataFrame:
    """A burst of ``burst`` requests cycling through ``lengths``, with or without ``allow_ragged_batch``.

    Request *i* sends ``[[i, i, ...]]`` (its length's worth), so each answer's ``total`` must be
    ``i * length``: a column ``intact`` says whether it was.
    """
    inputs = [dict(i) for i in _config_inputs(base)]
    for tensor in inputs:
        tensor["allowRaggedBatch"] = ragged
    reload(server, {"input": inputs}, base, model, warm=2)

    def request(i: int) -> dict[str, np.ndarray]:
        return {"INPUT0": np.full((1, lengths[i % len(lengths)]), i, dtype=np.float32)}

    answers = probe_load(server, model, burst, concurrency=burst, prefix=f"ragged-{ragged}", inputs=request)
    expected = [i * lengths[i % len(lengths)] for i in range(len(answers))]
    return answers.assign(length=[lengths[i % len(lengths)] for i in range(len(answers))],
                          intact=answers["total"].to_numpy() == np.array(expected, dtype=float))


def _config_inputs(config: Any) -> list[dict]:
    return json_format.MessageToDict(config)["input"]


def executions(answers: pd.DataFrame) -> dict[int, int]:
    """Batch size -> number of ``execute()`` calls, from the sizes the requests reported (a batch of
    n was reported by its n requests)."""
    counts = answers.loc[answers["ok"]].groupby("batch").size()
    return {int(size): int(n // size) for size, n in counts.items()}


def stub_processes(server: Any, answers: pd.DataFrame) -> pd.DataFrame:
    """The server's child processes (its Python stubs), with the instance each one serves, seen twice.

    The Python backend starts each instance's stub with the ``model.py`` path and the instance's
    name on its command line (python_backend ``src/stub_launcher.cc`` 333-338 and 378-382 at r24.10:
    the name is ``argv[8]``), and ``scheduler_probe`` returns its own instance name and PID
    with every answer (from :func:`probe_load`): the two views can be checked against each other.
    Read with psutil (:mod:`lab_backends.server.processes`): a local server only.
    """
    reported = answers.loc[answers["ok"]].drop_duplicates("pid").set_index("pid")["instance"]

    def read() -> list[dict]:
        rows = []
        for pid in sorted(processes.children(server.pid)):
            argv = processes.command_line(pid)
            if not argv:
                continue  # exited (or a zombie) since it was listed
            script = Path(argv[1]) if len(argv) > 1 else Path("")
            rows.append({"pid": pid, "program": Path(argv[0]).name, "model": script.parent.parent.name,
                         "instance (command line)": argv[8] if len(argv) > 8 else None,
                         "instance (reported)": reported.get(pid)})
        return rows

    def settled(rows: list[dict]) -> bool:
        # After a reload Triton stops the previous instances' stubs a moment after the new ones
        # serve: wait until every stub of the probed model is one that answered.
        probed = {r["model"] for r in rows if r["instance (reported)"] is not None}
        return all(r["instance (reported)"] is not None for r in rows if r["model"] in probed)

    rows = poll(read, settled, 15, 0.1)
    return pd.DataFrame(rows, columns=["pid", "program", "model", "instance (command line)", "instance (reported)"])


GIL_MODEL = "gil_spin"
#: The three ways to give gil_spin "two of something": none, two threads in execute(), two instances.
GIL_CONFIGS = {
    "1 instance, 1 thread": {},
    "1 instance, 2 threads": {"parameters": {"threads": {"string_value": "2"}}},
    "2 instances, 1 thread": {"instance_group": [{"kind": "KIND_CPU", "count": 2}]},
}


def gil_compare(server: Any, base: Any, n: int = 40, concurrency: int = 8, model: str = GIL_MODEL) -> pd.DataFrame:
    """The same closed-loop load on each of :data:`GIL_CONFIGS`, side by side: one row per config.

    The evidence that does not depend on a free core (the proof):

    * ``cores_per_execute`` is the mean of what each ``execute()`` reported (its process's CPU time
      over its wall time): the GIL caps it at one per process, whatever the thread count;
    * ``overlaps_across_processes`` counts pairs of ``execute()`` calls in *different* stub
      processes that ran at the same time, from the trace's compute stamps (requests of one
      ``execute()`` share them): two instances overlap, two threads live inside one ``execute()``,
      and one process never runs two at once (``overlaps_within_process`` stays 0).

    ``throughput_rps`` is what the learner sees, and it needs a free core to show the second
    process: on a machine whose other core is busy it does not rise.
    """
    rows = []
    for name, override in GIL_CONFIGS.items():
        one = {"INPUT0": np.ones((1, 1), np.float32)}
        reload(server, override, base, model, warm=2)
        started = time.monotonic()
        answers = probe_load(server, model, n, concurrency=concurrency, prefix=f"gil-{len(rows)}", inputs=one)
        window = time.monotonic() - started
        ran = traced_executions(server, answers, model)
        within = sum(overlapping_pairs(group) for _, group in ran.groupby("pid"))
        rows.append({"config": name, "throughput_rps": answers["ok"].sum() / window,
                     "cores_per_execute": answers["cores"].mean(), "max_cores_per_execute": answers["cores"].max(),
                     "stub_processes": answers["pid"].nunique(), "executions": len(ran),
                     "overlaps_across_processes": overlapping_pairs(ran) - within, "overlaps_within_process": within,
                     "errors": int((~answers["ok"]).sum())})
    return pd.DataFrame(rows).set_index("config")


def traced_executions(server: Any, answers: pd.DataFrame, model: str) -> pd.DataFrame:
    """One row per ``execute()`` that served ``answers`` (``start_ns, end_ns, pid, size``), from the trace.

    The requests of one ``execute()`` share its compute stamps (:mod:`~lab_backends.measure.batches`);
    the PID comes from the answers (a model that returns ``PID``, like ``gil_spin``).
    """
    ok = answers.loc[answers["ok"], "request_id"]
    log = tracing.read_trace(tracing.trace_path(server), request_ids=ok, timeout_s=30).select(ok)
    spans = compute_spans(log, model).merge(answers[["request_id", "pid"]], on="request_id")
    return spans.groupby(["start_ns", "end_ns"], as_index=False).agg(pid=("pid", "first"), size=("request_id", "size"))
