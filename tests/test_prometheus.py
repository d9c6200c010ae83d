"""measure.prometheus on real Prometheus pages: one recorded from Triton 2.51 (tests/data/stats), pages
written by prometheus_client's own registry (a counter, a gauge, a histogram, a summary), and, marked
``server``, the /metrics page of a live Triton with summary latencies on and a model that exports a
histogram of its own.

No family is dropped: a histogram keeps its buckets, ``_sum`` and ``_count``, a summary its quantiles
and both counters, and every sample keeps the name the page gives it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest

from lab_backends.errors import StatisticsError
from lab_backends.measure import pods, prometheus
from lab_backends.server.endpoints import Endpoint

TRITON_PAGE = (Path(__file__).resolve().parent / "data" / "stats" / "metrics_after.txt").read_text()
#: What Triton writes with --metrics-config summary_latencies=true (prometheus-cpp's layout).
TRITON_SUMMARY = """\
# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="m",version="1"} 4
nv_inference_request_summary_us_sum{model="m",version="1"} 4200
nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 1000
nv_inference_request_summary_us{model="m",version="1",quantile="0.9"} 1500
"""


class Registry:
    """A prometheus_client registry with one family of each type; ``page()`` is its /metrics text."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("requests", "Requests", ["model"], registry=self.registry)
        self.pending = Gauge("pending", "Pending requests", ["model"], registry=self.registry)
        self.latency = Histogram("latency_ms", "Latency", ["model"], buckets=(1, 10, 100), registry=self.registry)
        self.size = Summary("size_bytes", "Request size", registry=self.registry)

    def page(self) -> str:
        return generate_latest(self.registry).decode()


def test_the_recorded_triton_page_keeps_every_name_and_type() -> None:
    parsed = prometheus.parse_metrics(TRITON_PAGE)
    declared = {line.split()[2]: line.split()[3] for line in TRITON_PAGE.splitlines() if line.startswith("# TYPE")}
    assert parsed.types == declared
    lines = [line for line in TRITON_PAGE.splitlines() if line and not line.startswith("#")]
    assert len(parsed.samples) == len(lines)
    # Triton's counters have no _total suffix, and must not gain one (the parser adds it; we undo that).
    assert parsed.samples[("nv_inference_count", (("model", "cost_model"), ("version", "1")))] == 272
    assert parsed.kind("nv_inference_count") == "counter" and parsed.kind("nv_cpu_utilization") == "gauge"


def test_histograms_and_summaries_are_kept() -> None:
    reg = Registry()
    reg.requests.labels("a").inc(3)
    reg.latency.labels("a").observe(5)
    reg.latency.labels("b").observe(500)
    reg.size.observe(7)
    parsed = prometheus.parse_metrics(reg.page())
    assert parsed.types["requests_total"] == "counter"  # declared with _total: kept as is
    assert parsed.types["latency_ms"] == "histogram" and parsed.types["size_bytes"] == "summary"
    assert parsed.samples[("requests_total", (("model", "a"),))] == 3
    buckets = {dict(labels)["le"]: v for (name, labels), v in parsed.samples.items()
               if name == "latency_ms_bucket" and ("model", "a") in labels}
    assert buckets == {"1.0": 0, "10.0": 1, "100.0": 1, "+Inf": 1}
    assert parsed.samples[("latency_ms_sum", (("model", "b"),))] == 500
    assert parsed.samples[("latency_ms_count", (("model", "b"),))] == 1
    assert parsed.samples[("size_bytes_count", ())] == 1 and parsed.samples[("size_bytes_sum", ())] == 7
    assert parsed.kind("latency_ms_bucket") == parsed.kind("latency_ms_sum") == "histogram"
    assert parsed.kind("size_bytes_sum") == "summary"


def test_a_window_over_histograms_summaries_counters_and_gauges() -> None:
    reg = Registry()
    reg.requests.labels("a").inc(3)
    reg.latency.labels("a").observe(5)
    reg.size.observe(7)
    before = reg.page()
    reg.requests.labels("a").inc(2)
    reg.requests.labels("b").inc(10)
    reg.pending.labels("a").set(4)
    for ms in (0.5, 50, 50, 5000):
        reg.latency.labels("a").observe(ms)
    reg.latency.labels("b").observe(5)
    reg.size.observe(9)
    after = reg.page()
    delta = prometheus.metrics_delta(before, after, "a")
    assert delta["requests_total"] == 2 and delta["pending"] == 4
    assert delta["latency_ms_count"] == 4 and delta["latency_ms_sum"] == 5100.5
    assert {k: v for k, v in delta.items() if k.startswith("latency_ms_bucket")} == {
        'latency_ms_bucket{le="1.0"}': 1, 'latency_ms_bucket{le="10.0"}': 1,
        'latency_ms_bucket{le="100.0"}': 3, 'latency_ms_bucket{le="+Inf"}': 4}
    assert delta["size_bytes_count"] == 1 and delta["size_bytes_sum"] == 9  # no model label: kept
    everyone = prometheus.metrics_delta(before, after)
    assert everyone["requests_total"] == 12 and everyone['latency_ms_bucket{le="10.0"}'] == 2
    timeline = prometheus.metrics_timeline([(0.0, before), (1.0, after)], "a")
    assert timeline['latency_ms_bucket{le="+Inf"}'].tolist() == [0, 4]


def test_summary_quantiles_are_read_but_never_differenced() -> None:
    later = TRITON_SUMMARY.replace("} 4\n", "} 6\n").replace("} 4200", "} 5000").replace("} 1500", "} 1700")
    delta = prometheus.metrics_delta(TRITON_SUMMARY, later, "m")
    assert delta == {"nv_inference_request_summary_us_count": 2, "nv_inference_request_summary_us_sum": 800}
    quantiles = prometheus.summary_quantiles(later, "m")
    assert quantiles.to_dict() == {0.5: 1.0, 0.9: 1.7}


def test_a_page_written_back_reads_the_same() -> None:
    reg = Registry()
    reg.latency.labels('say "hi"\\now').observe(5)  # a label value that needs escaping
    reg.size.observe(7)
    for page in (TRITON_PAGE, TRITON_SUMMARY, reg.page()):
        parsed = prometheus.parse_metrics(page)
        again = prometheus.parse_metrics(prometheus.render_metrics(parsed))
        assert again == parsed


def test_a_page_that_is_not_prometheus_text_is_refused() -> None:
    with pytest.raises(StatisticsError, match="not in the Prometheus text format"):
        prometheus.parse_metrics('nv_inference_count{model="a} 1\n')


def test_pods_pages_are_summed_histograms_included_quantiles_left_out(monkeypatch) -> None:
    reg_a, reg_b = Registry(), Registry()
    reg_a.latency.labels("m").observe(5)
    reg_b.latency.labels("m").observe(50)
    reg_a.requests.labels("m").inc(1)
    reg_b.requests.labels("m").inc(2)
    pages = {"http://a/metrics": reg_a.page() + TRITON_SUMMARY, "http://b/metrics": reg_b.page() + TRITON_SUMMARY}
    monkeypatch.setattr(pods.rest, "request", lambda url, timeout: (200, pages[url].encode()))
    server = SimpleNamespace(metrics_url="http://a/metrics", endpoints=[
        Endpoint("a:8000", "triton-0", "http://a/metrics"), Endpoint("b:8000", "triton-1", "http://b/metrics")])
    summed = prometheus.parse_metrics(pods.summed_metrics(server))
    assert summed.types["latency_ms"] == "histogram" and summed.types["requests_total"] == "counter"
    assert summed.samples[("requests_total", (("model", "m"),))] == 3
    assert summed.samples[("latency_ms_bucket", (("le", "10.0"), ("model", "m")))] == 1
    assert summed.samples[("latency_ms_bucket", (("le", "+Inf"), ("model", "m")))] == 2
    assert summed.samples[("nv_inference_request_summary_us_count", (("model", "m"), ("version", "1")))] == 8
    assert not [key for key in summed.samples if "quantile" in dict(key[1])]


#: A Python model that exports a histogram of its own (Triton 2.51 itself writes none: its latency
#: families are counters and, with summary_latencies, summaries); one observation per request.
HISTOGRAM_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        # The family must outlive its metrics: keep it on the model, not in a local variable.
        self.family = pb_utils.MetricFamily(name="lab_rows", description="rows per request",
                                            kind=pb_utils.MetricFamily.HISTOGRAM)
        self.rows = self.family.Metric(labels={"model": args["model_name"]}, buckets=[1.0, 2.0, 4.0])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.rows.observe(float(x.shape[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


@pytest.mark.server
def test_a_live_triton_page(tmp_path) -> None:
    """A real /metrics page: counters, gauges, summaries with quantiles, and a model's own histogram."""
    from lab_backends.client.infer import infer
    from lab_backends.measure import stats
    from lab_backends.server.triton_server import TritonServer

    (tmp_path / "histo" / "1").mkdir(parents=True)
    (tmp_path / "histo" / "1" / "model.py").write_text(HISTOGRAM_MODEL)
    (tmp_path / "histo" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    with TritonServer(model_repository=tmp_path, metrics_config={"summary_latencies": "true"},
                      startup_timeout_s=180) as server:
        before = stats.scrape_metrics(server)
        for rows in (1, 3, 3, 8):
            infer(server, "histo", {"IN": np.ones(rows, np.float32)})
        after = stats.scrape_metrics(server)
    parsed = prometheus.parse_metrics(after)
    assert prometheus.parse_metrics(prometheus.render_metrics(parsed)) == parsed
    assert parsed.types["nv_inference_request_success"] == "counter"
    assert parsed.types["nv_inference_request_summary_us"] == "summary"
    assert parsed.types["lab_rows"] == "histogram"
    assert prometheus.summary_quantiles(after, "histo").notna().any()
    delta = prometheus.metrics_delta(before, after, "histo")
    assert delta["nv_inference_request_success"] == 4
    assert delta["nv_inference_request_summary_us_count"] == 4
    buckets = {k: v for k, v in delta.items() if k.startswith("lab_rows_bucket")}
    assert buckets == {'lab_rows_bucket{le="1"}': 1, 'lab_rows_bucket{le="2"}': 1, 'lab_rows_bucket{le="4"}': 3,
                       'lab_rows_bucket{le="+Inf"}': 4}, buckets
    assert delta["lab_rows_count"] == 4 and delta["lab_rows_sum"] == 15
