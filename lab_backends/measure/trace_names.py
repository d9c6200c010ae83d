"""Triton's own timestamp names next to the stages ``trace`` derives from them.

Why: ``receive``, ``queue``, ``infer``, ``send``, ``cache`` and ``pipeline`` are names this
package gives to the span *between* two timestamps; Triton never writes them. A learner who opens
the trace JSON finds ``QUEUE_START``, ``COMPUTE_START``, ``INFER_RESPONSE_COMPLETE``, ... So every
derived stage is shown here with the two raw names (and nanosecond stamps) it runs between.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab_backends.errors import TraceError
from lab_backends.measure.trace import EXTRA_STAGES, STAGES, TraceLog, read_records


def stage_sources(log: TraceLog, trace_id: int) -> pd.DataFrame:
    """One row per derived stage of one traced request: the raw timestamps it starts and ends at.

    The names are looked up by their nanosecond value in the request's own stamps, so the table
    shows what the parser really used (two names with the same nanosecond are joined by ``=``).
    """
    stamps = log.stamps[log.stamps["trace_id"] == trace_id]
    stages = log.stages[log.stages["trace_id"] == trace_id]
    if stages.empty:
        raise TraceError(f"trace {trace_id} has no stages in this log: pick a trace_id from log.requests")

    def names_at(ns: int) -> str:
        return " = ".join(sorted(stamps.loc[stamps["ns"] == ns, "name"].unique())) or "?"

    rows = [
        {"stage (ours)": row.stage, "from (Triton's stamp)": names_at(row.start_ns),
         "to (Triton's stamp)": names_at(row.end_ns), "start_ns": row.start_ns, "end_ns": row.end_ns,
         "ms": row.duration_ms}
        for row in stages.sort_values("start_ns").itertuples()
    ]
    return pd.DataFrame(rows)


def raw_timestamp_names(path: str | Path) -> set[str]:
    """Every timestamp name Triton wrote in a trace file (and its ``.0``, ``.1``, ... parts)."""
    return {t["name"] for r in read_records(path) for t in r.get("timestamps", [])}


#: Our stage names: none of them is a word Triton writes in a trace file.
DERIVED_STAGES = (*STAGES, *EXTRA_STAGES)
