"""The batch timeline view of :class:`~lab_backends.lessons.widgets.BatchingPanel`.

The panel's load generator keeps no responses, and ``cost_model`` does not name its instances, so
the view draws *lanes*: batches rebuilt from the trace's shared compute stamps
(:func:`lab_backends.measure.batches.lanes`), each on the first lane free when it started. That
needs a server started with a trace file (``trace_file=...``, ``trace_log_frequency=1``; its level
may be ``OFF``): :meth:`TimelineWindow.open` turns tracing on for the panel's model alone, for the
run, and :meth:`TimelineWindow.close` puts that model's settings back, so the rest of a notebook
runs untraced. Only the requests traced since ``open`` are drawn.

Deferred import: matplotlib (~1 s), only when the timeline is drawn.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab_backends.errors import TraceError
from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import compute_spans, lanes

NEEDS_TRACE = ("the batch timeline needs a server started with a trace file: "
               "TritonServer(..., trace_file=path, trace_level=('OFF',), trace_log_frequency=1)")
#: What the panel's runs are traced with (one part file per trace, so it can be read at once).
TRACING = {"trace_level": ["TIMESTAMPS"], "trace_rate": 1, "log_frequency": 1}


def _ids(server: Any, model: str) -> set[int]:
    try:
        log = tracing.TraceLog.from_records(tracing.read_records(tracing.trace_path(server)))
    except TraceError:
        return set()
    rows = log.requests
    return set(rows.loc[(rows["model"] == model) & (rows["depth"] == 0), "trace_id"])


class TimelineWindow:
    """Remembers which traces existed before a run, then rebuilds the batches of the run."""

    def __init__(self, server: Any, model: str) -> None:
        self.server, self.model = server, model
        self.before: set[int] = set()
        self.restore: dict[str, Any] | None = None

    @property
    def available(self) -> bool:
        return getattr(self.server, "trace_file", None) is not None

    def open(self) -> None:
        """Trace the model from now on (remembering its settings), and note the traces already written."""
        if not self.available:
            return
        settings = tracing.trace_settings(self.server, self.model)
        self.restore = {key: settings[key] for key in TRACING}
        tracing.update_trace_settings(self.server, self.model, **TRACING)
        self.before = _ids(self.server, self.model)

    def close(self) -> None:
        """Give the model its trace settings from before :meth:`open` back."""
        if self.restore is not None:
            restore, self.restore = self.restore, None
            tracing.update_trace_settings(self.server, self.model, **restore)

    def batches(self, requests: int, timeout_s: float = 10.0) -> pd.DataFrame:
        """The run's batches on lanes; waits until ``requests`` new traces have been written."""
        if not self.available:
            raise TraceError(NEEDS_TRACE)
        path = tracing.trace_path(self.server)
        log = tracing.read_trace(path, expect=len(self.before) + requests, timeout_s=timeout_s)
        rows = log.requests
        new = rows[(rows["model"] == self.model) & (rows["depth"] == 0) & ~rows["trace_id"].isin(self.before)]
        run = tracing.TraceLog(new.reset_index(drop=True), log.stages[log.stages["trace_id"].isin(new["trace_id"])],
                               log.stamps[log.stamps["trace_id"].isin(new["trace_id"])])
        spans = compute_spans(run, self.model)
        spans["request_id"] = spans["request_id"].fillna("").astype(str) + "#" + new["trace_id"].astype(str).to_numpy()
        return lanes(spans)


def _renderer(figure: Any) -> Any:
    """A renderer to measure text with (a bare ``Figure`` has none until it is given a canvas)."""
    if not hasattr(figure.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(figure)
    return figure.canvas.get_renderer()


def label_batches(ax: Any, table: pd.DataFrame, pad_px: float = 2.0) -> int:
    """Write each batch's size inside its bar of a :func:`~lab_backends.measure.plots_batches.batch_timeline`
    drawn without labels, only where the text fits inside the bar; returns how many were written.

    A fixed minimum width in ms (the chart's own rule) lets a 4 s run put "16" on 5 ms bars a pixel
    wide, one over the next. Here each label is measured on the final layout (call this after
    ``tight_layout``): wider than its bar minus ``pad_px`` each side, it is left out. Bars of one
    lane never overlap, so the labels kept never overlap either.
    """
    if table.empty:
        return 0
    renderer = _renderer(ax.figure)
    ax.get_xlim()  # brings the (lazily autoscaled) data limits up to date before transData is used
    origin = int(table["start_ns"].min())
    lanes_in_order = sorted(table["instance"].unique())  # the rows batch_timeline drew, bottom up
    written = 0
    for row_index, name in enumerate(lanes_in_order):
        rows = table[table["instance"] == name]
        for start_ns, end_ns, size in rows[["start_ns", "end_ns", "size"]].itertuples(index=False):
            start, end = (int(start_ns) - origin) / 1e6, (int(end_ns) - origin) / 1e6
            (left, _), (right, _) = ax.transData.transform([(start, row_index), (end, row_index)])
            text = ax.text((start + end) / 2, row_index, str(int(size)), ha="center", va="center",
                           fontsize="x-small", color="white", clip_on=True)
            if text.get_window_extent(renderer).width + 2 * pad_px > right - left:
                text.remove()
            else:
                written += 1
    return written
