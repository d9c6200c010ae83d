"""Triton's Prometheus page, parsed: samples and types, counter deltas over a window, timelines, summaries.

The metrics endpoint is the server's other window on itself (beside the statistics API of
:mod:`lab_backends.measure.stats`): counters any monitoring system scrapes, and, with
``--metrics-config summary_latencies=true``, quantiles the server computes itself. A model may add
families of its own (``pb_utils.MetricFamily``: counters, gauges and histograms). The page is read
with ``prometheus_client``'s parser, every family kept: counters, gauges, summaries and histograms.
Pure functions on the page's text, unit-tested on pages recorded from a real server and on pages
written by ``prometheus_client``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from lab_backends.errors import StatisticsError

# ------------------------------------------------------------------------------- Prometheus text

Labels = tuple[tuple[str, str], ...]
#: A counter declared as ``x_total``: the parser names its family ``x`` and keeps the samples' ``x_total``;
#: a counter declared as ``x`` (all of Triton's) it also names ``x`` but renames the samples ``x_total``.
_COUNTER_TYPE = re.compile(r"^#\s*TYPE\s+(\S+)\s+counter\s*$", re.MULTILINE)


@dataclass
class Metrics:
    """A parsed Prometheus page, every sample under the name the page gives it.

    * ``samples``: (sample name, sorted labels) -> value. A summary has its quantile samples (label
      ``quantile``) plus ``_sum`` and ``_count``; a histogram its ``_bucket`` samples (label ``le``,
      cumulative) plus ``_sum`` and ``_count``.
    * ``types``: family name, as its ``# TYPE`` line writes it -> counter, gauge, summary or histogram.
    * ``family_of``: sample name -> its family's name (``x_bucket`` -> ``x``), in page order.
    """

    samples: dict[tuple[str, Labels], float]
    types: dict[str, str]
    family_of: dict[str, str] = field(default_factory=dict)

    def kind(self, sample: str) -> str:
        """The type of the family that ``sample`` belongs to; ``untyped`` without a ``# TYPE`` line."""
        return self.types.get(self.family_of.get(sample, sample), "untyped")


def parse_metrics(text: str) -> Metrics:
    """Parse the Prometheus text format (``prometheus_client.parser``); no family is dropped."""
    declared_total = set(_COUNTER_TYPE.findall(text))
    samples: dict[tuple[str, Labels], float] = {}
    types: dict[str, str] = {}
    family_of: dict[str, str] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise StatisticsError(f"the metrics page is not in the Prometheus text format: {exc}") from exc
    for family in families:
        name = family.name
        renamed = family.type == "counter" and f"{name}_total" not in declared_total  # undo the parser's _total
        if family.type == "counter" and not renamed:
            name = f"{name}_total"
        if family.type not in ("unknown", "untyped"):
            types[name] = family.type
        for sample in family.samples:
            sample_name = name if renamed else sample.name
            family_of[sample_name] = name
            samples[(sample_name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return Metrics(samples, types, family_of)


def render_metrics(metrics: Metrics) -> str:
    """A :class:`Metrics` written back as a Prometheus text page: each family's ``# TYPE``, then its samples."""
    by_family: dict[str, list[str]] = {}
    for (name, labels), value in metrics.samples.items():
        family = metrics.family_of.get(name, name)
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        line = f"{name}{{{rendered}}} {floatToGoString(value)}" if rendered else f"{name} {floatToGoString(value)}"
        by_family.setdefault(family, []).append(line)
    lines = []
    for family in dict.fromkeys([*by_family, *metrics.types]):  # also a declared family without samples
        if family in metrics.types:
            lines.append(f"# TYPE {family} {metrics.types[family]}")
        lines += by_family.get(family, [])
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_delta(before: str | Metrics, after: str | Metrics, model: str | None = None) -> dict[str, float]:
    """Counter deltas (summed over label sets) and gauge values after, for one model or all.

    Counters are what a window is made of (``nv_inference_count``, ``..._duration_us``), and so are
    a summary's and a histogram's ``_sum`` and ``_count``; a histogram's buckets are counters too,
    one per upper bound, keyed ``name{le="..."}``. Quantiles are not (the server's sliding window),
    and a gauge (``nv_cpu_utilization``, memory) has no meaningful difference, so its *after* value
    is given. Samples that carry a ``model`` label are kept only when it matches ``model``.
    """
    b = before if isinstance(before, Metrics) else parse_metrics(before)
    a = after if isinstance(after, Metrics) else parse_metrics(after)
    out: dict[str, float] = {}
    for (name, labels), value in a.samples.items():
        label_map = dict(labels)
        if model is not None and "model" in label_map and label_map["model"] != model:
            continue
        kind = a.kind(name)
        if kind == "gauge":
            out[name] = out.get(name, 0.0) + value
        elif kind == "counter" or (kind in ("summary", "histogram") and "quantile" not in label_map):
            key = f'{name}{{le="{label_map["le"]}"}}' if kind == "histogram" and "le" in label_map else name
            out[key] = out.get(key, 0.0) + value - b.samples.get((name, labels), 0.0)
    return out


def metrics_timeline(samples: list[tuple[float, str]], model: str | None = None) -> "Any":
    """Prometheus pages sampled during a window -> a DataFrame, one row per sample.

    Columns: ``t_s`` (seconds into the window), every counter as its increase since the first
    sample, every gauge as sampled, and three rates derived between consecutive samples:
    ``throughput_rps``, ``avg_batch`` and ``queue_ms`` (average queue time per request).
    """
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
