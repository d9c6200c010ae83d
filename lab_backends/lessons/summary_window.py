"""Triton's summary latencies cover a sliding TIME window, not a number of requests.

Why a module: Triton 2.51 builds its ``nv_inference_*_summary_us`` summaries with prometheus-cpp's
defaults, a 60 s ``max_age`` in 5 age buckets, and ``--metrics-config`` accepts only
``counter_latencies``, ``summary_latencies`` and ``summary_quantiles`` (an unknown key such as
``summary_max_age`` is silently ignored). So the quantiles describe the requests of the last
minute: a minute after the last request they read NaN, while ``_count`` and ``_sum`` stay
cumulative. Measured on the embedded server: values at 56 s, NaN at 60 s after the last request.
"""

from __future__ import annotations

import math
import time
from typing import Any

from lab_backends import waiting
from lab_backends.measure import stats

#: prometheus-cpp's default Summary max_age (seconds); Triton 2.51 has no flag to change it.
SUMMARY_WINDOW_S = 60.0
#: The only summary-related keys Triton 2.51's --metrics-config understands.
SUMMARY_KEYS = ("summary_latencies", "summary_quantiles")

REQUEST_SUMMARY = "nv_inference_request_summary_us"


def _sample(text: str, name: str, model: str, **labels: str) -> float | None:
    wanted = {"model": model, **labels}
    for (sample, label_pairs), value in stats.parse_metrics(text).samples.items():
        pairs = dict(label_pairs)
        if sample == name and all(pairs.get(k) == v for k, v in wanted.items()) and \
                ("quantile" in pairs) == ("quantile" in labels):
            return value
    return None


def counter(text: str, name: str, model: str) -> float | None:
    """A per-model counter's value (e.g. ``nv_inference_request_success``) from one metrics page."""
    return _sample(text, name, model)


def summary_count(text: str, model: str, family: str = REQUEST_SUMMARY) -> float | None:
    """The summary's ``_count``: every observation since the model loaded (cumulative)."""
    return _sample(text, f"{family}_count", model)


def median_us(text: str, model: str, family: str = REQUEST_SUMMARY) -> float:
    """The summary's p50 in microseconds; NaN once the window holds no observation."""
    value = _sample(text, family, model, quantile="0.5")
    return math.nan if value is None else value


def seconds_until_expired(server: Any, model: str, timeout_s: float = SUMMARY_WINDOW_S + 20) -> float:
    """Scrape until the p50 reads NaN (no request in the window); the seconds that took.

    Send nothing to ``model`` meanwhile. Returns ``math.inf`` if it never expired in time.
    """
    start = time.monotonic()
    last = waiting.poll(lambda: median_us(stats.scrape_metrics(server), model), math.isnan,
                        timeout_s=timeout_s, interval_s=1.0)
    return time.monotonic() - start if math.isnan(last) else math.inf
