"""What a run hands back: per-request rows, a client summary, and the server's view of the same window."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab_backends.measure import stats as _stats
from lab_backends.measure.loadgen.loops import Record

_PERCENTILES = (50, 90, 95, 99)


@dataclass
class LoadResult:
    """One measured window: per-request rows, a client summary, and the server's view."""

    requests: pd.DataFrame
    summary: dict[str, Any]
    server: _stats.ServerWindow | None = None
    metrics: dict[str, float] | None = None
    #: Prometheus pages taken right before and after the window (when asked for).
    metrics_text: tuple[str, str] | None = None
    #: Prometheus counters sampled every ``metrics_every_s`` during the window (when asked for):
    #: one row per sample, ``t_s`` plus one column per metric (see :func:`stats.metrics_timeline`).
    metrics_timeline: pd.DataFrame | None = None
    #: The raw statistics payloads taken right before and after the window (when asked for).
    stats_payloads: tuple[dict, dict] | None = None
    warmup: pd.DataFrame = field(default_factory=pd.DataFrame)

    def row(self) -> dict[str, Any]:
        """Summary plus server columns: one row of a tidy sweep frame."""
        row = dict(self.summary)
        if self.server is not None:
            row.update(self.server.as_row())
        return row


def records_frame(records: list[Record], origin: float) -> pd.DataFrame:
    if not records:
        return pd.DataFrame(columns=["scheduled_s", "start_s", "end_s", "latency_ms", "ok", "error"])
    arr = np.array([r[:3] for r in records], dtype=float) - origin
    errors = [r[3] for r in records]
    frame = pd.DataFrame(
        {
            "scheduled_s": arr[:, 0],
            "start_s": arr[:, 1],
            "end_s": arr[:, 2],
            "latency_ms": (arr[:, 2] - arr[:, 0]) * 1000.0,
            "ok": [not e for e in errors],
            "error": errors,
        }
    )
    return frame.sort_values("scheduled_s", ignore_index=True)


def summarize(frame: pd.DataFrame, window_s: float) -> dict[str, Any]:
    """Throughput over the window and latency percentiles of the successful requests."""
    ok = frame[frame["ok"]] if len(frame) else frame
    latencies = ok["latency_ms"].to_numpy() if len(ok) else np.array([])
    summary: dict[str, Any] = {
        "requests": int(len(frame)),
        "ok": int(len(ok)),
        "errors": int(len(frame) - len(ok)),
        "window_s": float(window_s),
        "throughput_rps": float(len(ok) / window_s) if window_s > 0 else float("nan"),
        "mean_ms": float(latencies.mean()) if latencies.size else float("nan"),
    }
    for p in _PERCENTILES:
        summary[f"p{p}_ms"] = float(np.percentile(latencies, p)) if latencies.size else float("nan")
    errors = frame.loc[~frame["ok"], "error"] if len(frame) else []
    summary["first_error"] = str(errors.iloc[0]) if len(errors) else ""
    return summary
