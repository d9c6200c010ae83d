"""Waterfall plots of traced requests: one row per request, one coloured bar per stage.

Kept apart from :mod:`lab_backends.measure.plots` (load and latency figures) because it only needs the
tidy stage table of :mod:`lab_backends.measure.trace`, nothing about load generation.

Deferred import: matplotlib (~1 s), in the functions that draw.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab_backends.errors import TraceError
from lab_backends.measure.trace import EXTRA_STAGES, STAGES

#: One colour per stage, stable across figures so that "queue" is always the same orange.
STAGE_COLORS = {
    "receive": "#4c78a8",
    "queue": "#f58518",
    "compute_input": "#72b7b2",
    "infer": "#54a24b",
    "output": "#b279a2",
    "send": "#9d755d",
    "cache": "#e45756",
    "pipeline": "#bab0ac",
}


def _depths(stages: pd.DataFrame) -> dict[int, int]:
    parents = {
        int(t): int(p)
        for t, p in stages[["trace_id", "parent_id"]].drop_duplicates().itertuples(index=False)
        if pd.notna(p)
    }
    depths = {}
    for tid in stages["trace_id"].unique():
        depth, cur = 0, int(tid)
        while cur in parents and depth < 64:
            cur, depth = parents[cur], depth + 1
        depths[int(tid)] = depth
    return depths


def waterfall(stages: pd.DataFrame, ax: Any = None, title: str | None = None, per_request_origin: bool = False):
    """Draw the stages of one or more requests as a waterfall and return the matplotlib Axes.

    ``stages`` is :attr:`TraceLog.stages` or a slice of it (e.g. :meth:`TraceLog.family`). Time is in
    milliseconds from the earliest stage shown, so queued requests visibly start their compute late;
    with ``per_request_origin=True`` each root request starts at 0 instead (to compare shapes).
    Children (ensemble steps, BLS calls) are drawn indented under their parent.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if stages is None or stages.empty:
        raise TraceError("nothing to draw: the stage table is empty (were requests traced? is trace_rate 1?)")
    depths = _depths(stages)
    first = stages.groupby("trace_id")["start_ns"].min()
    roots = stages.groupby("trace_id")["root_id"].first()
    root_start = stages.groupby("root_id")["start_ns"].min()
    order = sorted(first.index, key=lambda t: (root_start[roots[t]], roots[t], depths[int(t)], first[t]))
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(order) + 1.4))
    origin = stages["start_ns"].min()
    labels = []
    for row, tid in enumerate(order):
        rows = stages[stages["trace_id"] == tid]
        head = rows.iloc[0]
        zero = root_start[roots[tid]] if per_request_origin else origin
        for stage in rows.itertuples(index=False):
            ax.barh(row, (stage.end_ns - stage.start_ns) / 1e6, left=(stage.start_ns - zero) / 1e6,
                    color=STAGE_COLORS.get(stage.stage, "grey"), edgecolor="white", linewidth=0.5, height=0.7)
        rid = f" '{head.request_id}'" if isinstance(head.request_id, str) and depths[int(tid)] == 0 else ""
        proto = f" ({head.protocol})" if depths[int(tid)] == 0 and isinstance(head.protocol, str) else ""
        labels.append(
            "    " * depths[int(tid)] + ("└ " if depths[int(tid)] else "") + f"{head.model} #{tid}{rid}{proto}"
        )
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(
        "milliseconds" + (" since the request arrived" if per_request_origin else " since the first stage shown")
    )
    shown = [s for s in (*STAGES, *EXTRA_STAGES) if s in set(stages["stage"])]
    ax.legend(
        handles=[Patch(color=STAGE_COLORS[s], label=s) for s in shown],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    return ax


def stage_bars(requests: pd.DataFrame, ax: Any = None, title: str | None = None):
    """Stacked bars of the mean time per stage, per model (from :attr:`TraceLog.requests`)."""
    import matplotlib.pyplot as plt

    cols = [f"{s}_ms" for s in STAGES]
    means = requests.groupby("model")[cols].mean().fillna(0.0)
    if means.empty:
        raise TraceError("nothing to draw: no traced requests")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 * len(means) + 1.5))
    left = pd.Series(0.0, index=means.index)
    for stage, col in zip(STAGES, cols):
        ax.barh(means.index, means[col], left=left, color=STAGE_COLORS[stage], label=stage)
        left += means[col]
    ax.set_xlabel("mean milliseconds per request")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax
