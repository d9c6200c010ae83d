"""Audit cases of ``metrics_window`` (notebook 10): counters over a window between two metrics scrapes."""

from prometheus_client.parser import text_string_to_metric_families

from lab_backends.lessons.exercises.audit import Wrong
from lab_backends.measure import prometheus


def _value(page, name, model):
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _window(before, after, model, requests="nv_inference_request_success", executions="nv_inference_exec_count",
            rows="nv_inference_count", cumulative=False):
    def grew(name):
        return _value(after, name, model) - (0.0 if cumulative else _value(before, name, model))

    return {"requests": grew(requests), "cache_hits": grew("nv_cache_num_hits_per_model"),
            "executions": grew(executions), "avg_batch": grew(rows) / grew(executions)}


def _requests_over_executions(before, after, model):
    window = _window(before, after, model)
    return {**window, "avg_batch": window["requests"] / window["executions"]}


def _misses_for_hits(before, after, model):
    return {**_window(before, after, model), "cache_hits": _value(after, "nv_cache_num_misses_per_model", model)
            - _value(before, "nv_cache_num_misses_per_model", model)}


WRONG = [
    Wrong("reads the after page alone: cumulative since the model loaded",
          lambda before, after, model: _window(before, after, model, cumulative=True), r"cumulative"),
    Wrong("counts requests with nv_inference_count (rows of executed requests)",
          lambda before, after, model: _window(before, after, model, requests="nv_inference_count"),
          r"'requests'.*nv_inference_count: inferences"),
    Wrong("counts executions with the request counter: cache hits never execute",
          lambda before, after, model: _window(before, after, model, executions="nv_inference_request_success"),
          r"'executions'.*cache hit never reaches the model"),
    Wrong("average batch as requests per execution",
          _requests_over_executions, r"'avg_batch'.*divides requests by executions"),
    Wrong("takes the misses for the hits",
          _misses_for_hits, r"'cache_hits'.*number of misses"),
    Wrong("returns a tuple, not a dict",
          lambda before, after, model: tuple(_window(before, after, model).values()), r"must return a dict"),
]


def _with_parser(before, after, model):
    """prometheus_client's parser: it names the samples of Triton's counters ``<name>_total``."""
    def read(page):
        out = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.labels.get("model") == model:
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    b, a = read(before), read(after)

    def grew(name):
        return a.get(name + "_total", 0.0) - b.get(name + "_total", 0.0)

    return {"requests": int(grew("nv_inference_request_success")),
            "cache_hits": int(grew("nv_cache_num_hits_per_model")), "executions": int(grew("nv_inference_exec_count")),
            "avg_batch": grew("nv_inference_count") / grew("nv_inference_exec_count")}


def _with_the_lab_helper(before, after, model):
    """The lab's own parser (``measure.prometheus.metrics_delta``), as section 2 uses it."""
    d = prometheus.metrics_delta(before, after, model)
    return {"requests": d["nv_inference_request_success"], "cache_hits": d["nv_cache_num_hits_per_model"],
            "executions": d["nv_inference_exec_count"],
            "avg_batch": d["nv_inference_count"] / d["nv_inference_exec_count"]}


ALTERNATIVES = [_with_parser, _with_the_lab_helper]
