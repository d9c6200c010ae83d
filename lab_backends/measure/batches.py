"""Which instance ran which batch, and when: batches rebuilt from a trace and the model's answers.

Triton keeps one record of batches a client can read, and it has no times or request ids: the
statistics API's ``batch_stats``, a count of executions per batch size (core ``src/infer_stats.cc``
418-424 at r24.10). For the rest we read two other traces of them:

* **the trace**: a backend reports statistics *per request* (``TRITONBACKEND_ModelInstanceReportStatistics``,
  whose four compute stamps become that request's ``COMPUTE_*`` trace stamps: core
  ``src/infer_request.cc`` 1424-1438). The Python backend passes the same stamps for every request
  of one ``execute()`` (python_backend ``src/pb_metric_reporter.cc`` 44-67), so the requests of one
  batch share the very same ``COMPUTE_START`` and ``COMPUTE_END`` nanoseconds and two batches never
  share both. Grouping by stamps therefore relies on the backend doing so (our C backends do too,
  ``lab_finish_request``); a backend that stamped each request on its own would defeat it;
* **the instance**: traces and statistics do not say which instance ran a request, but the
  instance knows its own name; ``scheduler_probe`` returns it (and its stub's PID and the batch
  size it saw) with every response, collected by :func:`~lab_backends.measure.probe_load.probe_load`.

:func:`batches` joins the two into one row per executed batch (instance, start, end, size,
request ids); :func:`timeline_facts` states what must hold for that to be a faithful picture.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab_backends.errors import TraceError

BATCH_COLUMNS = ["instance", "pid", "start_ns", "end_ns", "compute_ms", "size", "model_batch", "request_ids"]


def compute_spans(log: Any, model: str) -> pd.DataFrame:
    """One row per traced top-level request of ``model``: ``request_id, queue_ns, start_ns, end_ns``."""
    stamps = log.stamps
    wide = stamps[stamps["name"].isin(["QUEUE_START", "COMPUTE_START", "COMPUTE_END"])].pivot_table(
        index="trace_id", columns="name", values="ns", aggfunc="min")
    requests = log.requests[(log.requests["model"] == model) & (log.requests["depth"] == 0)]
    spans = requests[["trace_id", "request_id"]].join(wide, on="trace_id")
    missing = [c for c in ("COMPUTE_START", "COMPUTE_END") if c not in spans.columns]
    if missing or spans[["COMPUTE_START", "COMPUTE_END"]].isna().any().any():
        raise TraceError(
            f"some traced requests of {model!r} have no COMPUTE_START/COMPUTE_END: start the server "
            "with trace_file=... and trace_level TIMESTAMPS, and read the trace after the requests ended "
            "(a response-cache hit has no compute stamps: turn the cache off for this model)"
        )
    spans = spans.rename(columns={"QUEUE_START": "queue_ns", "COMPUTE_START": "start_ns", "COMPUTE_END": "end_ns"})
    for col in ("queue_ns", "start_ns", "end_ns"):
        if col in spans:
            spans[col] = spans[col].astype("int64")
    return spans[["request_id", "queue_ns", "start_ns", "end_ns"]].reset_index(drop=True)


def batches(spans: pd.DataFrame, answers: pd.DataFrame) -> pd.DataFrame:
    """One row per executed batch, in start order, from :func:`compute_spans` and the probe's answers.

    Requests are grouped by their shared compute stamps; the instance comes from the answers
    (``request_id, instance, pid, batch``; failed requests never ran and are left out). A group
    whose requests name two instances would mean the grouping is wrong: a :class:`TraceError`.
    """
    ok = answers[answers["ok"]] if "ok" in answers else answers
    joined = spans.merge(ok[["request_id", "instance", "pid", "batch"]], on="request_id", how="inner")
    if joined.empty:
        raise TraceError("no request of the trace has an answer: pass the frame probe_load returned for the same run")
    rows = []
    for (start, end), group in joined.groupby(["start_ns", "end_ns"], sort=True):
        instances = group["instance"].unique()
        if len(instances) != 1:
            raise TraceError(
                f"the requests that share compute stamps {start}..{end} name {len(instances)} instances "
                f"({', '.join(map(str, instances))}): they cannot be one batch"
            )
        rows.append({
            "instance": instances[0], "pid": int(group["pid"].iloc[0]), "start_ns": int(start), "end_ns": int(end),
            "compute_ms": (end - start) / 1e6, "size": len(group), "model_batch": int(group["batch"].max()),
            "request_ids": sorted(group["request_id"]),
        })
    return pd.DataFrame(rows, columns=BATCH_COLUMNS)


def overlapping_pairs(frame: pd.DataFrame) -> int:
    """How many pairs of batches in ``frame`` run at the same time (an open interval overlap)."""
    starts, ends = frame["start_ns"].tolist(), frame["end_ns"].tolist()
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    pairs = 0
    for a, i in enumerate(order):
        for j in order[a + 1:]:
            if starts[j] >= ends[i]:
                break
            pairs += 1
    return pairs


def timeline_facts(table: pd.DataFrame, answers: pd.DataFrame) -> dict[str, Any]:
    """What a faithful batch timeline must show, as numbers a notebook can check.

    * ``requests_in_one_batch``: every request that was answered appears in exactly one batch;
    * ``sizes_agree``: each batch's size from the trace equals the size ``execute()`` saw;
    * ``overlaps_within_instance``: pairs of batches on one instance running at once (must be 0:
      an instance runs one ``execute()`` at a time);
    * ``overlaps_across_instances``: pairs of batches on *different* instances running at once
      (> 0 is what more instances buy).
    """
    ok_ids = set(answers.loc[answers["ok"], "request_id"]) if "ok" in answers else set(answers["request_id"])
    listed = [rid for ids in table["request_ids"] for rid in ids]
    within = sum(overlapping_pairs(group) for _, group in table.groupby("instance"))
    return {
        "batches": len(table),
        "instances": int(table["instance"].nunique()),
        "requests_in_one_batch": len(listed) == len(set(listed)) and set(listed) == ok_ids,
        "sizes_agree": bool((table["size"] == table["model_batch"]).all()),
        "overlaps_within_instance": within,
        "overlaps_across_instances": overlapping_pairs(table) - within,
        "avg_batch": float(table["size"].mean()) if len(table) else 0.0,
    }


def lanes(spans: pd.DataFrame) -> pd.DataFrame:
    """Batches from compute stamps alone, for a model that does not name its instances.

    Each batch goes to the first lane free at its start (lanes ordered by when they freed up).
    Batches on one instance never overlap, so this needs no more lanes than busy instances at the
    busiest moment; a lane is *an* instance's worth of work, not a particular one: the rows are
    named ``lane 1``, ``lane 2``, ... and ``pid`` is -1.
    """
    groups = spans.groupby(["start_ns", "end_ns"], sort=True)["request_id"].apply(sorted).reset_index()
    free_at: list[int] = []
    rows = []
    for start, end, ids in groups.itertuples(index=False):
        lane = next((i for i, t in enumerate(free_at) if t <= start), None)
        if lane is None:
            lane = len(free_at)
            free_at.append(end)
        free_at[lane] = end
        rows.append({"instance": f"lane {lane + 1}", "pid": -1, "start_ns": int(start), "end_ns": int(end),
                     "compute_ms": (end - start) / 1e6, "size": len(ids), "model_batch": len(ids),
                     "request_ids": ids})
    return pd.DataFrame(rows, columns=BATCH_COLUMNS)
