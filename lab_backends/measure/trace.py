"""Triton's trace files as tidy pandas tables: where did each request spend its time?

Triton (``--trace-config triton,file=F --trace-config level=TIMESTAMPS``) writes a JSON array of
small records, one fact each, **not in time order**::

    {"id": 9, "model_name": "m", "model_version": 1, "request_id": "r", "parent_id": 3}
    {"id": 9, "timestamps": [{"name": "QUEUE_START", "ns": 5578...}]}

This module folds them back into one row per traced request (:attr:`TraceLog.requests`) and one
row per stage (:attr:`TraceLog.stages`), the view a waterfall needs:

========== ============================================== ================================
stage      from                                           to
========== ============================================== ================================
receive    ``HTTP_RECV_START`` / ``GRPC_WAITREAD_END``    ``REQUEST_START``
queue      ``QUEUE_START``                                ``COMPUTE_START``
compute_input ``COMPUTE_START``                           ``COMPUTE_INPUT_END``
infer      ``COMPUTE_INPUT_END``                          ``COMPUTE_OUTPUT_START``
output     ``COMPUTE_OUTPUT_START``                       ``COMPUTE_END``
send       ``HTTP_SEND_START`` / ``GRPC_SEND_START``      ``HTTP_SEND_END`` / ``GRPC_SEND_END``
cache      ``QUEUE_START``                                ``INFER_RESPONSE_COMPLETE`` (cache hit)
pipeline   ``QUEUE_START``                                ``INFER_RESPONSE_COMPLETE`` (ensemble)
========== ============================================== ================================

Why these choices:

* ``GRPC_WAITREAD_START`` is when the gRPC front end *began waiting* for a request, which can be
  seconds before the client sent anything; gRPC's ``receive`` therefore starts at
  ``GRPC_WAITREAD_END`` (the request has been read) and covers parsing it into a Triton request.
* A response-cache hit and an ensemble have no ``COMPUTE_*`` stamps: nothing ran in a backend for
  them. Instead of a misleading empty ``queue`` they get a ``cache`` or ``pipeline`` stage.
* Children of an ensemble (and of a BLS model that passed ``trace=request.trace()``) carry
  ``parent_id``; front-end stages (receive/send) exist only on the top-level trace.

With ``log_frequency=0`` the traces collect in memory and ``F`` is written when the setting that
collected them goes away: at shutdown, or when a trace-settings update replaces it; with a
``trace_count`` they are also written (to ``F.0``, ...) once that many are collected (server
src/tracer.cc:235-254, 1200-1213, 1242-1248 at r24.10). With ``log_frequency=N`` Triton writes
``F.0``, ``F.1``, ... every N traces while it runs. :func:`read_trace` reads either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from lab_backends.errors import TraceError
from lab_backends.measure.pods import pod_trace_file

# Talking to the server (settings, a traced burst) lives in trace_control; notebooks call them as trace.*.
from lab_backends.measure.trace_control import send_burst as send_burst
from lab_backends.measure.trace_control import trace_path as trace_path
from lab_backends.measure.trace_control import trace_settings as trace_settings
from lab_backends.measure.trace_control import update_trace_settings as update_trace_settings

# Reading the files (trace_records, below both this module and pods); notebooks call them as trace.*.
from lab_backends.measure.trace_records import read_records as read_records
from lab_backends.measure.trace_records import trace_files as trace_files
from lab_backends.waiting import poll

#: The stages of one request, in the order a request goes through them.
STAGES = ("receive", "queue", "compute_input", "infer", "output", "send")
#: Stages of requests that ran no backend code of their own.
EXTRA_STAGES = ("cache", "pipeline")

_SPANS = {
    "queue": ("QUEUE_START", "COMPUTE_START"),
    "compute_input": ("COMPUTE_START", "COMPUTE_INPUT_END"),
    "infer": ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    "output": ("COMPUTE_OUTPUT_START", "COMPUTE_END"),
}
REQUEST_COLUMNS = [
    "trace_id", "parent_id", "model", "version", "request_id", "protocol", "depth",
    "start_ns", "end_ns", "total_ms", *[f"{s}_ms" for s in STAGES], "cache_hit", "children",
]
STAGE_COLUMNS = [
    "trace_id", "parent_id", "root_id", "model", "request_id", "protocol", "stage",
    "start_ns", "end_ns", "duration_ms",
]


# ---------------------------------------------------------------------------------------- files
def read_trace(path: str | Path, expect: int = 0, timeout_s: float = 10.0,
         request_ids: Iterable[str] = ()) -> "TraceLog":
    """Parse the trace at ``path``, waiting up to ``timeout_s`` until it is complete enough.

    "Complete enough" means at least ``expect`` top-level requests have ended, and every one of
    ``request_ids`` is there and has ended. Waiting matters with ``trace_log_frequency=1``: Triton
    writes a request's part file only once its response has been sent, a moment after the client
    already has the answer.
    """
    wanted = set(request_ids)
    # A class server: read the file of the pod that served these requests (measure/pods.py).
    path = pod_trace_file(path, wanted, timeout_s)

    def look() -> tuple[TraceLog | None, str]:
        try:
            log = TraceLog.from_records(read_records(path))
        except TraceError as exc:
            return None, str(exc)
        top = log.requests[(log.requests["depth"] == 0) & log.requests["end_ns"].notna()]
        missing = wanted - set(top["request_id"].dropna())
        if len(top) >= expect and not missing:
            return log, ""
        return None, (f"only {len(top)} of {expect} requests are complete in {path}" if len(top) < expect
                      else f"requests {sorted(missing)[:10]} are not (yet) complete in {path}")

    log, problem = poll(look, lambda seen: seen[0] is not None, timeout_s, 0.1)
    if log is None:
        raise TraceError(f"{problem} after {timeout_s:.0f} s")
    return log


# ---------------------------------------------------------------------------------------- parsing
def stamps_frame(records: Iterable[dict]) -> pd.DataFrame:
    """One row per timestamp: ``trace_id``, ``name``, ``ns``."""
    rows = [
        {"trace_id": int(r["id"]), "name": t["name"], "ns": int(t["ns"])}
        for r in records
        for t in r.get("timestamps", [])
    ]
    return pd.DataFrame(rows, columns=["trace_id", "name", "ns"])


def _protocol(names: dict[str, int]) -> str | None:
    if "HTTP_RECV_START" in names or "HTTP_SEND_START" in names:
        return "http"
    if "GRPC_WAITREAD_END" in names or "GRPC_SEND_START" in names:
        return "grpc"
    return None


def _spans(names: dict[str, int], protocol: str | None, has_children: bool) -> list[tuple[str, int, int]]:
    spans: list[tuple[str, int, int]] = []
    arrival = names.get("HTTP_RECV_START") if protocol == "http" else names.get("GRPC_WAITREAD_END")
    if arrival is not None and "REQUEST_START" in names:
        spans.append(("receive", arrival, names["REQUEST_START"]))
    for stage, (start, end) in _SPANS.items():
        if start in names and end in names:
            spans.append((stage, names[start], names[end]))
    if "COMPUTE_START" not in names and "QUEUE_START" in names and "INFER_RESPONSE_COMPLETE" in names:
        spans.append(("pipeline" if has_children else "cache", names["QUEUE_START"], names["INFER_RESPONSE_COMPLETE"]))
    prefix = {"http": "HTTP", "grpc": "GRPC"}.get(protocol or "")
    if prefix and f"{prefix}_SEND_START" in names and f"{prefix}_SEND_END" in names:
        spans.append(("send", names[f"{prefix}_SEND_START"], names[f"{prefix}_SEND_END"]))
    return spans


@dataclass
class TraceLog:
    """A parsed trace.

    * ``requests``: one row per traced request (children included, ``depth`` > 0), with
      ``<stage>_ms`` columns, ``protocol`` (``http``/``grpc`` for what a front end received,
      empty for children), ``parent_id`` and the ids of its ``children``;
    * ``stages``: one row per stage, tidy (``trace_id, root_id, stage, start_ns, end_ns,
      duration_ms``); its ``protocol`` is the one of the root request, so a whole ensemble can be
      filtered by the front end that received it;
    * ``stamps``: the raw timestamps, one per row.
    """

    requests: pd.DataFrame
    stages: pd.DataFrame
    stamps: pd.DataFrame

    @classmethod
    def from_records(cls, records: list[dict]) -> "TraceLog":
        meta: dict[int, dict[str, Any]] = {}
        for record in records:
            if "id" not in record:
                raise TraceError(f"a trace record without an 'id': {record!r}")
            entry = meta.setdefault(int(record["id"]), {})
            for key in ("model_name", "model_version", "request_id", "parent_id"):
                if key in record:
                    entry[key] = record[key]
        stamps = stamps_frame(records)
        by_trace: dict[int, dict[str, int]] = {tid: {} for tid in meta}
        for tid, name, ns in stamps.itertuples(index=False):
            # A name can repeat (e.g. a decoupled model's responses): keep the earliest start, latest end.
            seen = by_trace[tid].get(name)
            keep_last = name.endswith("_END") or name == "INFER_RESPONSE_COMPLETE"
            if seen is None or (ns > seen if keep_last else ns < seen):
                by_trace[tid][name] = ns

        parents = {tid: int(m["parent_id"]) for tid, m in meta.items() if m.get("parent_id") is not None}
        children: dict[int, list[int]] = {}
        for child, parent in parents.items():
            children.setdefault(parent, []).append(child)

        def root_and_depth(tid: int) -> tuple[int, int]:
            depth = 0
            while tid in parents and parents[tid] in meta and depth < 64:
                tid, depth = parents[tid], depth + 1
            return tid, depth

        request_rows, stage_rows = [], []
        protocols: dict[int, str | None] = {}
        for tid in sorted(meta):
            protocols[tid] = _protocol(by_trace[tid])
        for tid in sorted(meta):
            m, names = meta[tid], by_trace[tid]
            root, depth = root_and_depth(tid)
            protocol = protocols[tid]
            spans = _spans(names, protocol, bool(children.get(tid)))
            durations = {stage: (end - start) / 1e6 for stage, start, end in spans}
            # The request starts at its first stage (or REQUEST_START); never at GRPC_WAITREAD_START.
            candidates = [s for _, s, _ in spans] + ([names["REQUEST_START"]] if "REQUEST_START" in names else [])
            start = min(candidates, default=None)
            ends = [names[n] for n in ("REQUEST_END", "HTTP_SEND_END", "GRPC_SEND_END") if n in names]
            end = max(ends) if ends else None
            request_rows.append({
                "trace_id": tid,
                "parent_id": parents.get(tid),
                "model": m.get("model_name"),
                "version": m.get("model_version"),
                "request_id": m.get("request_id") or None,
                "protocol": protocol,
                "depth": depth,
                "start_ns": start,
                "end_ns": end,
                "total_ms": (end - start) / 1e6 if start is not None and end is not None else None,
                **{f"{s}_ms": durations.get(s) for s in STAGES},
                "cache_hit": "cache" in durations,
                "children": sorted(children.get(tid, [])),
            })
            for stage, s, e in spans:
                stage_rows.append({
                    "trace_id": tid, "parent_id": parents.get(tid), "root_id": root,
                    "model": m.get("model_name"), "request_id": m.get("request_id") or None,
                    "protocol": protocols.get(root), "stage": stage,
                    "start_ns": s, "end_ns": e, "duration_ms": (e - s) / 1e6,
                })
        requests = pd.DataFrame(request_rows, columns=REQUEST_COLUMNS)
        requests["parent_id"] = requests["parent_id"].astype("Int64")
        requests["start_ns"] = requests["start_ns"].astype("Int64")
        requests["end_ns"] = requests["end_ns"].astype("Int64")
        stages = pd.DataFrame(stage_rows, columns=STAGE_COLUMNS)
        stages["parent_id"] = stages["parent_id"].astype("Int64")
        order = {s: i for i, s in enumerate(STAGES + EXTRA_STAGES)}
        stages = stages.sort_values(
            ["root_id", "start_ns", "stage"], key=lambda c: c.map(order) if c.name == "stage" else c
        )
        return cls(requests.reset_index(drop=True), stages.reset_index(drop=True), stamps)

    # ------------------------------------------------------------------ questions a notebook asks
    def request(self, request_id: str, model: str | None = None) -> pd.Series:
        """The top-level row of the request the client sent with ``request_id``."""
        rows = self.requests[(self.requests["request_id"] == request_id) & (self.requests["depth"] == 0)]
        if model is not None:
            rows = rows[rows["model"] == model]
        if rows.empty:
            known = sorted(set(self.requests["request_id"].dropna()))
            raise TraceError(
                f"no traced request with request_id {request_id!r}; known ids: {known[:20]}. "
                "Pass request_id=... when you infer, and check that trace_rate is 1."
            )
        return rows.iloc[0]

    def children(self, trace_id: int) -> pd.DataFrame:
        """The direct children of ``trace_id`` (ensemble steps, BLS calls), in start order."""
        return self.requests[self.requests["parent_id"] == trace_id].sort_values("start_ns")

    def family(self, trace_id: int) -> pd.DataFrame:
        """Stages of ``trace_id`` and every descendant, for a waterfall of one request."""
        ids = {trace_id}
        frontier = [trace_id]
        while frontier:
            nxt = self.requests.loc[self.requests["parent_id"].isin(frontier), "trace_id"].tolist()
            frontier = [i for i in nxt if i not in ids]
            ids.update(frontier)
        return self.stages[self.stages["trace_id"].isin(ids)]

    def select(self, request_ids: Iterable[str]) -> "TraceLog":
        """A TraceLog with only these top-level requests and their descendants (children, BLS calls)."""
        wanted = set(request_ids)
        roots = self.requests.loc[(self.requests["depth"] == 0) & self.requests["request_id"].isin(wanted), "trace_id"]
        keep: set[int] = set()
        for root in roots:
            keep.update(int(t) for t in self.family(int(root))["trace_id"].unique())
            keep.add(int(root))
        return TraceLog(
            self.requests[self.requests["trace_id"].isin(keep)].reset_index(drop=True),
            self.stages[self.stages["trace_id"].isin(keep)].reset_index(drop=True),
            self.stamps[self.stamps["trace_id"].isin(keep)].reset_index(drop=True),
        )

    def summary(self) -> pd.DataFrame:
        """Mean milliseconds per stage, per model (like the statistics API, but from the trace)."""
        cols = [f"{s}_ms" for s in STAGES] + ["total_ms"]
        return self.requests.groupby("model")[cols].mean().round(3)
