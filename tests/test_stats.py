"""The statistics arithmetic, on payloads recorded from a real Triton 2.51 (tests/data/stats/record.py).

The fixtures hold one closed-loop window on cost_model (8 in flight, dynamic batching): the
statistics payloads and Prometheus pages right before and after it, and what the client counted.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from lab_backends.errors import StatisticsError
from lab_backends.measure import stats

DATA = Path(__file__).resolve().parent / "data" / "stats"


def _load(name: str):
    path = DATA / name
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


@pytest.fixture(scope="module")
def recorded():
    return {name: _load(name) for name in (
        "stats_before.json", "stats_after.json", "stats_grpc.json", "window.json",
        "metrics_before.txt", "metrics_after.txt",
    )}


def test_window_counts_what_the_client_sent(recorded):
    w = stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "cost_model")
    seen = recorded["window.json"]
    assert w.requests == seen["client_ok"] == 200
    assert w.failures == 0
    assert w.inferences == 200  # one row per request
    assert w.executions == seen["executions"]
    assert sum(w.batch_hist.values()) == w.executions
    assert sum(size * n for size, n in w.batch_hist.items()) == w.inferences
    assert w.avg_batch == pytest.approx(w.inferences / w.executions)
    assert {str(k): v for k, v in w.batch_hist.items()} == seen["batch_hist"]


def test_window_averages_are_deltas_over_counts(recorded):
    before, after = recorded["stats_before.json"], recorded["stats_after.json"]
    w = stats.window(before, after, "cost_model")
    b = before["model_stats"][0]["inference_stats"]
    a = after["model_stats"][0]["inference_stats"]
    for stage in stats.STAGES:
        expected = (a[stage]["ns"] - b[stage]["ns"]) / (a[stage]["count"] - b[stage]["count"]) / 1e6
        assert getattr(w, f"{stage}_ms") == pytest.approx(expected)
    # cost_model sleeps >= 10 ms per execution, and every request waits inside one.
    assert w.compute_infer_ms >= 10.0
    # The stages happen inside the request's server time, so they cannot add up to more.
    parts = w.queue_ms + w.compute_input_ms + w.compute_infer_ms + w.compute_output_ms
    assert parts <= w.server_ms * 1.001
    # An execution of 8 rows costs 10 + 8 * 0.2 ms or more.
    assert w.batch_infer_ms[8] >= 11.6


def test_grpc_json_counters_as_strings_give_the_same_totals(recorded):
    # The gRPC message turned into JSON carries uint64 as strings; no traffic happened in between.
    http = stats.totals(recorded["stats_after.json"], "cost_model")
    grpc = stats.totals(recorded["stats_grpc.json"], "cost_model")
    assert grpc == http
    assert isinstance(grpc.inferences, int)


def test_a_reload_between_snapshots_is_refused(recorded):
    # After a reload the counters start again from zero: "after" smaller than "before".
    with pytest.raises(StatisticsError, match="reloaded"):
        stats.window(recorded["stats_after.json"], recorded["stats_before.json"], "cost_model")


def test_missing_model_is_a_clear_error(recorded):
    with pytest.raises(StatisticsError, match="no statistics for model 'nope'.*cost_model"):
        stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "nope")


def test_versions_are_summed_and_can_be_picked(recorded):
    after = copy.deepcopy(recorded["stats_after.json"])
    before = copy.deepcopy(recorded["stats_before.json"])
    for payload in (after, before):
        second = copy.deepcopy(payload["model_stats"][0])
        second["version"] = "2"
        payload["model_stats"].append(second)
    one = stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "cost_model")
    both = stats.window(before, after, "cost_model")
    assert both.requests == 2 * one.requests
    assert both.batch_hist == {k: 2 * v for k, v in one.batch_hist.items()}
    assert both.queue_ms == pytest.approx(one.queue_ms)
    assert stats.window(before, after, "cost_model", version="2").requests == one.requests


def test_an_empty_window_has_no_averages(recorded):
    w = stats.window(recorded["stats_after.json"], recorded["stats_after.json"], "cost_model")
    assert w.requests == w.executions == 0
    assert w.batch_hist == {}
    assert math.isnan(w.queue_ms) and math.isnan(w.avg_batch)


def test_row_is_flat_for_a_tidy_frame(recorded):
    row = stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "cost_model").as_row()
    assert row["server_requests"] == 200
    assert isinstance(row["batch_hist"], dict)
    assert "server_queue_ms" in row and "avg_batch" in row


def test_prometheus_counters_agree_with_the_statistics_api(recorded):
    delta = stats.metrics_delta(recorded["metrics_before.txt"], recorded["metrics_after.txt"], "cost_model")
    w = stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "cost_model")
    assert delta["nv_inference_request_success"] == w.requests
    assert delta["nv_inference_exec_count"] == w.executions
    assert delta["nv_inference_count"] == w.inferences
    # Durations in µs on the page, ns in the API: same quantity, rounding aside.
    queue_us = delta["nv_inference_queue_duration_us"]
    assert queue_us / w.requests / 1000.0 == pytest.approx(w.queue_ms, rel=0.01)
    # A gauge is reported as its value after the window, not as a difference.
    assert delta["nv_cpu_memory_total_bytes"] > 0
    assert delta["nv_inference_pending_request_count"] == 0


def test_prometheus_parser_handles_labels_and_filters_models():
    text = (
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="a",version="1"} 10\n'
        'nv_inference_count{model="b",version="1"} 99\n'
        "# TYPE temp gauge\n"
        "temp 3.5\n"
        'weird{label="with \\"quote\\", comma"} 1\n'
    )
    later = text.replace("} 10", "} 25")
    parsed = stats.parse_metrics(text)
    assert parsed.samples[("nv_inference_count", (("model", "a"), ("version", "1")))] == 10
    assert parsed.types["temp"] == "gauge"
    assert stats.metrics_delta(text, later, "a") == {"nv_inference_count": 15.0, "temp": 3.5}
    assert stats.metrics_delta(text, later)["nv_inference_count"] == 15.0


def test_metrics_timeline_derives_rates(recorded):
    samples = [(0.0, recorded["metrics_before.txt"]), (2.0, recorded["metrics_after.txt"])]
    frame = stats.metrics_timeline(samples, "cost_model")
    assert list(frame["t_s"]) == [0.0, 2.0]
    assert frame["nv_inference_request_success"].tolist() == [0, 200]
    assert frame["throughput_rps"].iloc[1] == pytest.approx(100.0)
    w = stats.window(recorded["stats_before.json"], recorded["stats_after.json"], "cost_model")
    assert frame["avg_batch"].iloc[1] == pytest.approx(w.avg_batch)
    assert frame["queue_ms"].iloc[1] == pytest.approx(w.queue_ms, rel=0.01)
