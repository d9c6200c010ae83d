"""What the server says happened to ONE request: its batch, its instance, its stage times.

Pure functions on what the server wrote (a parsed trace, statistics payloads, the model config),
so they are unit-tested on outputs recorded from a real server (``tests/data/inspector/``).

How the batch is found: Triton's dynamic batcher runs several requests in one ``execute()``; the
backend then reports the *same* ``COMPUTE_START`` and ``COMPUTE_END`` for every request of that
execution, and Triton copies them into each request's trace. Requests of one model with identical
compute stamps therefore ran together. For an ensemble (or BLS) the batching happens in the
composing models, so each child request is looked up on its own: the learner's preprocessing may
run in a batch of 4 while its postprocessing runs alone.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import pandas as pd
from tritonclient.grpc import model_config_pb2 as mc

from lab_backends.measure.trace import EXTRA_STAGES, STAGES, TraceLog

EXECUTION_COLUMNS = [
    "model",
    "trace_id",
    "depth",
    "compute_start_ns",
    "compute_end_ns",
    "batch_size",
    "shared_with",
    "compute_ms",
]


def _root_request_ids(log: TraceLog) -> dict[int, str | None]:
    """trace id -> request id of its top-level ancestor (children have no request id of their own)."""
    parents = {
        int(t): int(p) for t, p in log.requests[["trace_id", "parent_id"]].itertuples(index=False) if pd.notna(p)
    }
    rid = {int(t): r for t, r in log.requests[["trace_id", "request_id"]].itertuples(index=False)}
    out = {}
    for tid in rid:
        cur, hops = tid, 0
        while cur in parents and parents[cur] in rid and hops < 64:
            cur, hops = parents[cur], hops + 1
        out[tid] = rid.get(cur) if isinstance(rid.get(cur), str) else None
    return out


def compute_stamps(log: TraceLog) -> pd.DataFrame:
    """One row per traced request that ran in a backend: trace id, model, COMPUTE_START, COMPUTE_END."""
    stamps = log.stamps[log.stamps["name"].isin(["COMPUTE_START", "COMPUTE_END"])]
    wide = stamps.pivot_table(index="trace_id", columns="name", values="ns", aggfunc="min")
    if wide.empty or not {"COMPUTE_START", "COMPUTE_END"} <= set(wide.columns):
        return pd.DataFrame(columns=["trace_id", "model", "COMPUTE_START", "COMPUTE_END"])
    wide = wide.dropna().astype("int64").reset_index()
    models = log.requests.set_index("trace_id")["model"]
    wide["model"] = wide["trace_id"].map(models)
    return wide[["trace_id", "model", "COMPUTE_START", "COMPUTE_END"]]


def executions(log: TraceLog, request_id: str) -> pd.DataFrame:
    """Every backend execution that worked on ``request_id`` (itself, or its children), with its batch.

    ``batch_size`` counts the traced requests that share the execution's compute stamps;
    ``shared_with`` lists the request ids (of their top-level requests) of the others. ``log`` must
    hold every request that might have shared (load it without :meth:`TraceLog.select`, or select
    the whole burst), else a batch looks smaller than it was.
    """
    root = log.request(request_id)
    family = {int(root["trace_id"])} | {int(t) for t in log.family(int(root["trace_id"]))["trace_id"]}
    compute = compute_stamps(log)
    roots = _root_request_ids(log)
    depth = log.requests.set_index("trace_id")["depth"]
    groups = compute.groupby(["model", "COMPUTE_START", "COMPUTE_END"])["trace_id"].apply(list)
    rows = []
    for row in compute[compute["trace_id"].isin(family)].itertuples(index=False):
        members = groups[(row.model, row.COMPUTE_START, row.COMPUTE_END)]
        others = sorted({str(roots.get(int(m))) for m in members if int(m) != int(row.trace_id)})
        rows.append(
            {
                "model": row.model,
                "trace_id": int(row.trace_id),
                "depth": int(depth[row.trace_id]),
                "compute_start_ns": int(row.COMPUTE_START),
                "compute_end_ns": int(row.COMPUTE_END),
                "batch_size": len(members),
                "shared_with": others,
                "compute_ms": (int(row.COMPUTE_END) - int(row.COMPUTE_START)) / 1e6,
            }
        )
    return pd.DataFrame(rows, columns=EXECUTION_COLUMNS).sort_values("compute_start_ns").reset_index(drop=True)


def learner_batch(execs: pd.DataFrame) -> int:
    """The largest batch any execution of the request ran in (1 when it always ran alone)."""
    return int(execs["batch_size"].max()) if len(execs) else 0


def _only_instance(config: Any) -> str:
    """Triton's name for the first instance of the first group: ``<group>_0``, the group defaulting to
    ``<model>_0`` (core ``src/model_config_utils.cc`` 850-851 and ``src/backend_model.cc`` 594 at r24.10)."""
    group = config.instance_group[0].name if len(config.instance_group) and config.instance_group[0].name else ""
    return f"{group or config.name + '_0'}_0"


def instance_of(config: Any) -> str:
    """Which instance ran the request, as far as the server lets us know.

    Triton 2.51's trace does not name the instance; the config does say how many there are. With
    one instance (every digits model here) the answer is certain: ``<model>_0_0`` (instance 0 of
    the default group ``<model>_0``).
    """
    count = sum(g.count or 1 for g in config.instance_group) if len(config.instance_group) else 1
    if config.platform == "ensemble":
        return "none: an ensemble runs no code of its own (its steps ran in their own instances, below)"
    if count == 1:
        kind = config.instance_group[0].kind if len(config.instance_group) else 0

        kind_name = mc.ModelInstanceGroup.Kind.Name(kind)
        return f"{_only_instance(config)} ({kind_name}), the only instance its config declares"
    return (
        f"one of {count} instances of {config.name}; Triton 2.51's trace does not say which "
        "(the config's instance_group declares them)"
    )


def instance_name(config: Any) -> str:
    """Short form of :func:`instance_of` for a table column: ``<model>_0_0``, or ``1 of N`` when unknowable."""
    count = sum(g.count or 1 for g in config.instance_group) if len(config.instance_group) else 1
    return _only_instance(config) if count == 1 else f"1 of {count} (not in the trace)"


def stages_in_order(log: TraceLog, request_id: str) -> bool:
    """True when the request's own stages start in the order a request flows (receive, queue, ..., send).

    Starts, not ends, are compared: Triton may begin sending the response (``send``) while the
    backend is still finishing ``output``, so the last two can overlap by design.
    """
    root = log.request(request_id)
    own = log.stages[log.stages["trace_id"] == int(root["trace_id"])]
    rank = {s: i for i, s in enumerate((*STAGES[:2], *EXTRA_STAGES, *STAGES[2:]))}
    own = own.assign(rank=own["stage"].map(rank)).sort_values("rank")
    starts = own["start_ns"].astype("int64").tolist()
    return bool(len(own)) and all(a <= b for a, b in zip(starts, starts[1:])) and bool((own["duration_ms"] >= 0).all())


def stage_sum_ms(log: TraceLog, request_id: str) -> float:
    """Time the request's own stages cover, overlaps counted once (children run inside ``pipeline``).

    A plain sum would count twice the moment where ``send`` has begun while ``output`` is still
    finishing; the union of the stage intervals is the server time a client can compare with.
    """
    root = log.request(request_id)
    own = log.stages.loc[log.stages["trace_id"] == int(root["trace_id"]), ["start_ns", "end_ns"]]
    covered, reach = 0, None
    for start, end in sorted((int(a), int(b)) for a, b in own.itertuples(index=False)):
        if reach is None or start > reach:
            covered, reach = covered + end - start, end
        elif end > reach:
            covered, reach = covered + end - reach, end
    return covered / 1e6


def _natural(text: str) -> tuple:
    """Sort key that puts ``copy2`` before ``copy10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def shared_text(request_ids: Iterable[str], limit: int = 6) -> str:
    """The other requests of a batch as text: at most ``limit`` ids, then "… and N more" (never cut silently)."""
    ids = sorted(set(request_ids), key=_natural)
    if not ids:
        return "no other request"
    shown = ", ".join(ids[:limit])
    return shown if len(ids) <= limit else f"{shown} … and {len(ids) - limit} more"


#: Where Triton counts an ensemble's own statistics (core at r24.10, commit bfec7c61).
ENSEMBLE_STATS_SOURCE = (
    "core r24.10: src/ensemble_scheduler/ensemble_scheduler.cc:1449-1452 (each request gets its own "
    "EnsembleContext: no queue, no batcher), src/ensemble_scheduler/ensemble_scheduler.cc:94-98 (when its "
    "last step is done, one execution of the request's own batch size is recorded) and "
    "src/infer_stats.cc:418 (execution_count_++)"
)


def ensemble_batch_note(model: str, window: Any, execs: pd.DataFrame) -> str:
    """Why an ensemble's own "average batch" is 1.0 while its steps ran batches: the sentence the panel shows.

    Triton r24.10 schedules every ensemble request alone (``EnsembleScheduler::Enqueue`` creates one
    ``EnsembleContext`` per request, ``src/ensemble_scheduler/ensemble_scheduler.cc:1449-1452``) and,
    once the request's last step is done, records ONE execution of the request's own batch size
    (``RequestTracker::DecrementCounter``, ``ensemble_scheduler.cc:94-98`` calling
    ``UpdateInferBatchStatsWithDuration``, which does ``execution_count_++`` at ``src/infer_stats.cc:418``).
    So the ensemble's executions equal its successful requests, and its average batch is the rows
    per request (1 for one drawing). The batches the dynamic batcher formed are in the steps' rows.
    """
    steps = execs.groupby("model", sort=False)["batch_size"].max() if len(execs) else pd.Series(dtype=int)
    per_step = ", ".join(f"{name} {int(size)}" for name, size in steps.items()) or "none traced"
    return (
        f"Why {model}'s own average batch is {window.avg_batch:.1f}: an ensemble has no batcher. Triton schedules "
        f"each ensemble request alone and, when its last step is done, counts it as one execution of the "
        f"request's own batch size ({window.executions} executions for {window.requests} requests here). "
        f"The batching happens in its steps, each with its own scheduler: largest batch per step in this send: "
        f"{per_step} (from the trace). Source: Triton {ENSEMBLE_STATS_SOURCE}."
    )


def window_table(window: Any) -> pd.DataFrame:
    """The statistics delta as a two-column table a notebook can show."""
    rows = [
        ("successful requests", window.requests),
        ("failed requests", window.failures),
        ("inferences (rows)", window.inferences),
        ("executions", window.executions),
        ("average batch", round(window.avg_batch, 2)),
        ("mean queue ms", round(window.queue_ms, 3)),
        ("mean compute_infer ms", round(window.compute_infer_ms, 3)),
        ("batch sizes run", dict(window.batch_hist)),
    ]
    return pd.DataFrame(rows, columns=["statistic", "delta over this send"])
