"""Matplotlib views of load results: what batching does to latency, throughput and server time.

Every function takes the tidy frame of :func:`lab_backends.measure.sweep.sweep` (or a
:class:`~lab_backends.measure.loadgen.LoadResult`), draws on the ``ax`` it is given (or a new one) and returns
that ``ax``, so notebooks can compose them and the widget panel can redraw them in place.

Deferred import: matplotlib (~1 s), in the functions that draw.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

STAGE_COLUMNS = {
    "server_queue_ms": "queue",
    "server_compute_input_ms": "compute input",
    "server_compute_infer_ms": "compute infer",
    "server_compute_output_ms": "compute output",
}


def axes_or_new(ax: Any = None) -> Any:
    """``ax``, or a new 6x4 figure's axes when it is ``None`` (every plot here and in plots_batches)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def _finish(ax: Any, xlabel: str, ylabel: str, title: str) -> Any:
    """Labels, title, a legend when something is labelled, and a light grid: the line charts' frame."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return ax


def _groups(frame: pd.DataFrame, by: str = "config") -> list[tuple[str, pd.DataFrame]]:
    if by in frame.columns:
        return [(str(name), group) for name, group in frame.groupby(by, sort=False)]
    return [("", frame)]


def latency_vs_concurrency(
    frame: pd.DataFrame, ax: Any = None, percentiles: Sequence[int] = (50, 90, 99), by: str = "config"
) -> Any:
    """Latency percentiles against requests in flight, one colour per config, one style per percentile."""
    ax = axes_or_new(ax)
    styles = ["-", "--", ":", "-."]
    for i, (name, group) in enumerate(_groups(frame, by)):
        group = group.sort_values("concurrency")
        for style, p in zip(styles, percentiles):
            ax.plot(group["concurrency"], group[f"p{p}_ms"], style, marker="o", color=f"C{i}",
                    label=f"{name} p{p}".strip())
    return _finish(ax, "requests in flight (concurrency)", "latency (ms)", "Latency vs concurrency")


def throughput_vs_concurrency(frame: pd.DataFrame, ax: Any = None, by: str = "config", ceiling: Any = None) -> Any:
    """Throughput against concurrency; ``ceiling`` (a function of concurrency) draws the model's limit."""
    ax = axes_or_new(ax)
    for i, (name, group) in enumerate(_groups(frame, by)):
        group = group.sort_values("concurrency")
        ax.plot(group["concurrency"], group["throughput_rps"], marker="o", color=f"C{i}", label=name or None)
    if ceiling is not None:
        xs = np.array(sorted(frame["concurrency"].unique()), dtype=float)
        ax.plot(xs, [ceiling(x) for x in xs], "k:", label="ceiling")
    return _finish(ax, "requests in flight (concurrency)", "throughput (requests/s)", "Throughput vs concurrency")


def latency_throughput(frame: pd.DataFrame, ax: Any = None, by: str = "config", percentile: int = 50) -> Any:
    """The latency-throughput curve per config: batching moves it right (more) and down (faster)."""
    ax = axes_or_new(ax)
    for i, (name, group) in enumerate(_groups(frame, by)):
        group = group.sort_values("concurrency" if "concurrency" in group else "throughput_rps")
        ax.plot(group["throughput_rps"], group[f"p{percentile}_ms"], marker="o", color=f"C{i}", label=name or None)
        if "concurrency" in group:
            for _, row in group.iterrows():
                if pd.notna(row["concurrency"]):
                    ax.annotate(f"c={int(row['concurrency'])}", (row["throughput_rps"], row[f"p{percentile}_ms"]),
                                textcoords="offset points", xytext=(4, 4), fontsize="x-small")
    return _finish(ax, "throughput (requests/s)", f"p{percentile} latency (ms)", "Latency vs throughput")


def batch_histogram(hist: Mapping[int, int] | pd.Series | Any, ax: Any = None, label: str = "") -> Any:
    """How many executions ran at each batch size (from ``batch_stats``)."""
    ax = axes_or_new(ax)
    if hasattr(hist, "batch_hist"):  # a ServerWindow
        hist = hist.batch_hist
    hist = dict(hist or {})
    if hist:
        sizes = sorted(hist)
        ax.bar(sizes, [hist[s] for s in sizes], width=0.8, label=label or None, alpha=0.7)
    else:
        ax.text(0.5, 0.5, "no executions in the window", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("batch size")
    ax.set_ylabel("executions")
    ax.set_title("Batch sizes the server ran")
    if label:
        ax.legend(fontsize="small")
    return ax


def batch_histograms(frame: pd.DataFrame, ax: Any = None, concurrency: int | None = None, by: str = "config") -> Any:
    """The batch histogram of each config at one concurrency (default: the highest)."""
    ax = axes_or_new(ax)
    if concurrency is None:
        concurrency = frame["concurrency"].max()
    rows = frame[frame["concurrency"] == concurrency]
    for _, row in rows.iterrows():
        batch_histogram(row.get("batch_hist") or {}, ax=ax, label=f"{row.get(by, '')} c={int(concurrency)}")
    return ax


def server_breakdown(frame: pd.DataFrame, ax: Any = None, by: str = "config") -> Any:
    """Average server time per request, stacked by stage, for each config and concurrency."""
    ax = axes_or_new(ax)
    labels = [
        f"{row.get(by, '')}\nc={int(row['concurrency'])}" if pd.notna(row.get("concurrency")) else str(row.get(by, ""))
        for _, row in frame.iterrows()
    ]
    bottom = np.zeros(len(frame))
    x = np.arange(len(frame))
    for column, name in STAGE_COLUMNS.items():
        values = frame[column].fillna(0).to_numpy(dtype=float) if column in frame else np.zeros(len(frame))
        ax.bar(x, values, bottom=bottom, label=name)
        bottom += values
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize="x-small")
    ax.set_ylabel("ms per request")
    ax.set_title("Server time by stage (statistics API)")
    ax.legend(fontsize="small")
    return ax


def over_time(requests: pd.DataFrame | Any, ax: Any = None, bin_s: float | None = None) -> Any:
    """Throughput (bars) and median latency (line) in time bins across one window (~20 bins by default).

    In an open loop that the server cannot keep up with, the latency line climbs for as long as
    the window lasts: that is the queue growing.
    """
    if hasattr(requests, "requests"):  # a LoadResult
        requests = requests.requests
    ax = axes_or_new(ax)
    if not len(requests):
        ax.text(0.5, 0.5, "no requests", ha="center", va="center", transform=ax.transAxes)
        return ax
    ok = requests[requests["ok"]]
    if bin_s is None:  # about 20 bins across the window
        bin_s = max(float(requests["end_s"].max()) / 20.0, 0.01)
    edges = np.arange(0.0, float(requests["end_s"].max()) + bin_s, bin_s)
    bins = pd.cut(ok["end_s"], edges, include_lowest=True)
    counts = ok.groupby(bins, observed=False).size().to_numpy() / bin_s
    medians = ok.groupby(bins, observed=False)["latency_ms"].median().to_numpy()
    centers = edges[:-1] + bin_s / 2
    ax.bar(centers, counts, width=bin_s * 0.9, alpha=0.4, color="C0", label="throughput")
    ax.set_xlabel("time in window (s)")
    ax.set_ylabel("completed requests/s", color="C0")
    twin = ax.twinx()
    twin.plot(centers, medians, color="C3", marker=".", label="p50 latency")
    twin.set_ylabel("p50 latency (ms)", color="C3")
    ax.set_title("Over time")
    return ax


#: The panels of :func:`metrics_over_time`: timeline column -> (y label, the client's summary key to compare).
METRIC_PANELS = {
    "throughput_rps": ("throughput (req/s)", "throughput_rps"),
    "queue_ms": ("queue per request (ms)", None),
    "avg_batch": ("average batch size", None),
}


def metrics_over_time(
    timeline: pd.DataFrame | Any, ax: Any = None, columns: Sequence[str] = tuple(METRIC_PANELS)
) -> list[Any]:
    """The server's Prometheus counters sampled during a run, one small panel per metric, time shared.

    Why small multiples: requests/s, milliseconds and a batch size have nothing in common but the
    time axis; on one plot with three y axes the lines cross for no reason and every reading needs
    a colour lookup. Here each panel has its own labelled y axis, and the panels share the x axis.
    ``ax``: None (a new figure), one Axes (its area is split into the panels, e.g. the right half
    of a two-plot figure) or one Axes per column. Given a ``LoadResult``, the throughput panel also
    draws the client's own throughput over the whole window as a dashed line. Returns the panels.
    """
    client = getattr(timeline, "summary", None)
    if hasattr(timeline, "metrics_timeline"):  # a LoadResult
        timeline = timeline.metrics_timeline
    shown = [c for c in columns if timeline is not None and c in timeline] or list(columns[:1])
    axes = _panels(ax, len(shown))
    if timeline is None or len(timeline) < 2:
        axes[0].text(0.5, 0.5, "no metrics timeline: pass metrics_every_s", ha="center", va="center",
                     transform=axes[0].transAxes)
        return axes
    for i, (panel, column) in enumerate(zip(axes, shown)):
        label, client_key = METRIC_PANELS.get(column, (column, None))
        panel.plot(timeline["t_s"], timeline[column], marker=".", color=f"C{i}", label="server (Prometheus)")
        if client_key and client and client.get(client_key) is not None:
            panel.axhline(client[client_key], color="k", linestyle="--", linewidth=1,
                          label=f"client, whole window: {client[client_key]:.0f}")
            panel.legend(fontsize="x-small", loc="lower right")
        panel.set_ylabel(label, fontsize="small")
        panel.set_ylim(bottom=0)
        panel.grid(alpha=0.3)
        if panel is not axes[-1]:
            panel.tick_params(labelbottom=False)
    axes[-1].set_xlabel("time in window (s)")
    axes[0].set_title("Server metrics over time (Prometheus)")
    return axes


def _panels(ax: Any, count: int) -> list[Any]:
    """``count`` Axes stacked with a shared x axis: new, carved out of ``ax``, or ``ax`` itself (a sequence)."""
    if isinstance(ax, (list, tuple, np.ndarray)):
        return list(np.ravel(ax))[:count]
    if ax is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(count, 1, figsize=(6, 1.6 * count + 0.8), sharex=True, squeeze=False)
        return list(axes[:, 0])
    fig, spec = ax.figure, ax.get_subplotspec().subgridspec(count, 1, hspace=0.08)
    ax.remove()
    first = fig.add_subplot(spec[0])
    return [first] + [fig.add_subplot(spec[i], sharex=first) for i in range(1, count)]


def batching_figure(frame: pd.DataFrame, title: str = "", by: str = "config", fig: Any = None) -> Any:
    """Four panels: throughput and latency vs concurrency, latency-throughput, server stages."""
    import matplotlib.pyplot as plt

    if fig is None:
        fig = plt.figure(figsize=(12, 8))
    else:
        fig.clear()
    axes = fig.subplots(2, 2)
    throughput_vs_concurrency(frame, axes[0, 0], by=by)
    latency_vs_concurrency(frame, axes[0, 1], percentiles=(50, 99), by=by)
    latency_throughput(frame, axes[1, 0], by=by)
    if "batch_hist" in frame.columns:
        batch_histograms(frame, axes[1, 1], by=by)
    else:
        server_breakdown(frame, axes[1, 1], by=by)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
