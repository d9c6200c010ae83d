"""The response cache as the metrics page shows it, per model (notebook 10 and its exercise).

The statistics API counts a model's cache hits and misses whatever happened before; the metrics
page has per-model cache counters too (``nv_cache_num_hits_per_model``, ``..._misses_per_model``
and their durations), but only when Triton made the model's *metric reporter* with the cache on
(core ``src/metric_model_reporter.cc`` L218-226 at r24.10). A reporter is found again by its labels
(model and version) and reused while the model it served is still loaded (L122-135), which is the
case during a reload: the new model takes over the old one's reporter. So a model reloaded with
``response_cache { enable: true }`` (``caching.enable_cache``) shows no cache counters, and its
request counters keep counting across the reload; an unload, then a load, makes a new reporter
with them (and the counters start again from 0). Measured on the embedded 2.51.

Counters move a moment after the client has its answer (the backend reports a request's
statistics after sending its responses), so :func:`settled_page` waits until the page shows the
traffic that was sent.
"""

from __future__ import annotations

from typing import Any

from lab_backends.errors import LabBackendsError
from lab_backends.measure import prometheus, stats
from lab_backends.server.config_changes import derive_config
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

HITS = "nv_cache_num_hits_per_model"
#: What a window of one model is made of on the metrics page: our name -> Triton's counter.
COUNTERS = {"requests": "nv_inference_request_success", "inferences": "nv_inference_count",
            "executions": "nv_inference_exec_count", "cache_hits": HITS}


def has_counter(page: str, model: str, name: str) -> bool:
    """Whether the metrics page carries counter ``name`` for ``model``."""
    return any(sample == name and dict(labels).get("model") == model
               for sample, labels in prometheus.parse_metrics(page).samples)


def has_cache_counters(page: str, model: str) -> bool:
    """Whether the metrics page carries ``model``'s per-model cache counters."""
    return has_counter(page, model, HITS)


def with_cache(config: Any) -> Any:
    """A copy of ``config`` with ``response_cache { enable: true }``."""
    return derive_config(config, lambda c: setattr(c.response_cache, "enable", True))


def load_afresh(server: RunningServer, model: str, config: Any, timeout_s: float = 30.0) -> None:
    """Unload ``model``, then load it with ``config``: a new metric reporter, unlike a reload.

    The unload call returns before the last holder of the old reporter lets go of it; a load in
    that moment would find and reuse it. The reporter removes its samples from the page when it is
    destroyed (``metric_model_reporter.cc`` L166-192), so the load waits until they are gone.
    """
    server.unload_model(model)

    def reported() -> bool:
        return has_counter(stats.scrape_metrics(server), model, COUNTERS["requests"])

    if poll(reported, lambda still: not still, timeout_s=timeout_s, interval_s=0.05):
        raise LabBackendsError(f"{model}'s metrics were still on the page {timeout_s:.0f} s after it was unloaded")
    server.load_model(model, config=config)


def counters(page: str, model: str, since: str | None = None) -> dict[str, float]:
    """The values of :data:`COUNTERS` for ``model`` on ``page``, or their growth since page ``since``."""
    delta = prometheus.metrics_delta(since if since is not None else "", page, model)
    return {key: delta.get(name, 0.0) for key, name in COUNTERS.items()}


def settled_page(server: RunningServer, model: str, wanted: dict[str, float], since: str | None = None,
                 timeout_s: float = 15.0, strict: bool = True) -> str:
    """A metrics page whose :func:`counters` (since ``since``) equal ``wanted``.

    After ``timeout_s`` without it: raises, or with ``strict=False`` returns the last page (for a
    notebook's ``check`` to say what differs).
    """
    def shows(page: str) -> bool:
        return counters(page, model, since) == {k: float(wanted[k]) for k in COUNTERS}

    page = poll(lambda: stats.scrape_metrics(server), shows, timeout_s=timeout_s, interval_s=0.05)
    if strict and not shows(page):
        raise LabBackendsError(f"the metrics of {model} never showed {wanted} (they show "
                               f"{counters(page, model, since)}): is another client sending it requests?")
    return page
