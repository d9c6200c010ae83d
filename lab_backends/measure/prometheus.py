"""Triton's Prometheus page, parsed: samples and types, counter deltas over a window, timelines, summaries.

The metrics endpoint is the server's other window on itself (beside the statistics API of
:mod:`lab_backends.measure.stats`): counters any monitoring system scrapes, and, with
``--metrics-config summary_latencies=true``, quantiles the server computes itself. Pure functions on
the page's text, unit-tested on pages recorded from a real server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lab_backends.errors import StatisticsError

# ------------------------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Metrics:
    """A parsed Prometheus page: samples keyed by (name, sorted labels), plus each family's type."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    types: dict[str, str]


def parse_metrics(text: str) -> Metrics:
    """Parse the Prometheus text format (enough of it for Triton's page)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# TYPE"):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, _, labels, value = match.groups()
        key = tuple(sorted(_LABEL.findall(labels or "")))
        try:
            samples[(name, key)] = float(value)
        except ValueError:
            continue
    return Metrics(samples, types)


def metrics_delta(before: str | Metrics, after: str | Metrics, model: str | None = None) -> dict[str, float]:
    """Counter deltas (summed over label sets) and gauge values after, for one model or all.

    Counters are what a window is made of (``nv_inference_count``, ``..._duration_us``); a gauge
    (``nv_cpu_utilization``, memory) has no meaningful difference, so its *after* value is given.
    Samples that carry a ``model`` label are kept only when it matches ``model``.
    """
    b = before if isinstance(before, Metrics) else parse_metrics(before)
    a = after if isinstance(after, Metrics) else parse_metrics(after)
    out: dict[str, float] = {}
    for (name, labels), value in a.samples.items():
        label_map = dict(labels)
        if model is not None and "model" in label_map and label_map["model"] != model:
            continue
        kind = a.types.get(name) or a.types.get(re.sub(r"_(sum|count|total|bucket)$", "", name), "untyped")
        if kind == "counter" or (kind == "summary" and name.endswith(("_sum", "_count"))):
            out[name] = out.get(name, 0.0) + value - b.samples.get((name, labels), 0.0)
        elif kind == "gauge":
            out[name] = out.get(name, 0.0) + value
    return out


def metrics_timeline(samples: list[tuple[float, str]], model: str | None = None) -> "Any":
    """Prometheus pages sampled during a window -> a DataFrame, one row per sample.

    Columns: ``t_s`` (seconds into the window), every counter as its increase since the first
    sample, every gauge as sampled, and three rates derived between consecutive samples:
    ``throughput_rps``, ``avg_batch`` and ``queue_ms`` (average queue time per request).
    """
    import pandas as pd

    if not samples:
        return pd.DataFrame(columns=["t_s"])
    first = parse_metrics(samples[0][1])
    rows = [{"t_s": t, **metrics_delta(first, parse_metrics(text), model)} for t, text in samples]
    frame = pd.DataFrame(rows)
    dt = frame["t_s"].diff()
    if "nv_inference_request_success" in frame:
        done = frame["nv_inference_request_success"].diff()
        frame["throughput_rps"] = done / dt
        if "nv_inference_queue_duration_us" in frame:
            frame["queue_ms"] = frame["nv_inference_queue_duration_us"].diff() / done / 1000.0
    if "nv_inference_count" in frame and "nv_inference_exec_count" in frame:
        frame["avg_batch"] = frame["nv_inference_count"].diff() / frame["nv_inference_exec_count"].diff()
    return frame


# ------------------------------------------------------------------------------ summary latencies


def summary_quantiles(metrics_text: str, model: str, family: str = "nv_inference_request_summary_us") -> pd.Series:
    """The server's latency quantiles for ``model`` from one Prometheus page, in milliseconds.

    Needs ``--metrics-config summary_latencies=true`` (``TritonServer(metrics_config=...)``);
    without it the family is absent and this says so. The index is the quantile (0.5, 0.9, ...).
    """
    parsed = parse_metrics(metrics_text)
    values = {}
    for (name, labels), value in parsed.samples.items():
        label_map = dict(labels)
        if name == family and label_map.get("model") == model and "quantile" in label_map:
            values[float(label_map["quantile"])] = value / 1000.0
    if not values:
        raise StatisticsError(
            f"no '{family}' quantiles for model '{model}' on the metrics page: start the server with "
            "metrics_config={'summary_latencies': 'true'} and send the model some requests first"
        )
    return pd.Series(values, name=f"{family} (ms)").sort_index()


def summary_table(metrics_text: str, model: str) -> pd.DataFrame:
    """Quantiles (ms) of request, queue and compute-infer time side by side, one column each."""
    families = {
        "request": "nv_inference_request_summary_us",
        "queue": "nv_inference_queue_summary_us",
        "compute_infer": "nv_inference_compute_infer_summary_us",
    }
    return pd.DataFrame({label: summary_quantiles(metrics_text, model, fam) for label, fam in families.items()})
