"""The batch timeline: one row per model instance, one bar per executed batch.

Takes the frame of :func:`lab_backends.measure.batches.batches`. Bars are as wide as the batch's
compute time and labelled with its size, so one look shows what throughput numbers hide: whether
the instances really run side by side, how full each batch is, and the gaps where an instance waited.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab_backends.measure.plots import axes_or_new


def batch_timeline(table: pd.DataFrame, ax: Any = None, title: str = "", label_min_ms: float = 4.0) -> Any:
    """A Gantt chart of ``table`` (``instance, start_ns, end_ns, size``); time in ms from the first batch.

    Sizes are written inside bars at least ``label_min_ms`` wide (narrower ones would only smudge).
    """
    ax = axes_or_new(ax)
    if table.empty:
        ax.set_title(title or "Batch timeline (no batches)")
        return ax
    origin = int(table["start_ns"].min())
    instances = sorted(table["instance"].unique())
    biggest = max(int(table["size"].max()), 1)
    cmap = __import__("matplotlib").colormaps["viridis"]
    for row_index, name in enumerate(instances):
        rows = table[table["instance"] == name]
        starts = (rows["start_ns"] - origin) / 1e6
        widths = (rows["end_ns"] - rows["start_ns"]) / 1e6
        colours = [cmap(0.15 + 0.75 * size / biggest) for size in rows["size"]]
        ax.broken_barh(list(zip(starts, widths)), (row_index - 0.4, 0.8), facecolors=colours,
                       edgecolor="white", linewidth=0.5)
        for start, width, size in zip(starts, widths, rows["size"]):
            if width >= label_min_ms:
                ax.text(start + width / 2, row_index, str(int(size)), ha="center", va="center",
                        fontsize="x-small", color="white")
    ax.set_yticks(range(len(instances)))
    ax.set_yticklabels(instances)
    ax.set_ylim(-0.6, len(instances) - 0.4)
    ax.set_xlabel("time since the first batch started (ms)")
    ax.set_title(title or f"Batch timeline: {len(table)} batches on {len(instances)} instances (label = batch size)")
    ax.grid(axis="x", alpha=0.3)
    return ax
