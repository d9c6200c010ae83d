"""lab_backends.lessons.caching and measure.prometheus against a real server: response cache, rate limiter,
summary latencies."""

from __future__ import annotations

import numpy as np
import pytest

from lab_backends.errors import LoadSettingError, StatisticsError
from lab_backends.lessons import caching
from lab_backends.measure import loadgen, prometheus, stats
from lab_backends.server import endpoints
from lab_backends.server.config_changes import apply_config
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

X = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=["cost_model"], cache_size=1 << 20, rate_limit_resources={"R": 1},
                      metrics_config={"summary_latencies": "true"}, startup_timeout_s=180) as srv:
        yield srv


def test_summary_quantiles(server) -> None:
    result = loadgen.run_closed(server, "cost_model", concurrency=2, inputs={"INPUT0": X}, requests=40,
                             duration_s=2.0, warmup_requests=2)
    text = stats.scrape_metrics(server)
    quantiles = prometheus.summary_quantiles(text, "cost_model")
    assert list(quantiles.index) == [0.5, 0.9, 0.95, 0.99, 0.999]
    assert (quantiles > 0).all() and quantiles.is_monotonic_increasing
    # Each request's time in the server lies inside its time at the client, so the server's p50 of these requests
    # cannot exceed the client's p50, let alone its p99, whatever the machine does. That needs the summary's 60 s
    # window (summary_window.SUMMARY_WINDOW_S) to hold only these 42 requests: this test runs first in the module.
    # After the rate limiter's test it held theirs too: its p50 came from them (21.7 ms against this run's p99 of
    # 25.3 ms here), and had a slow client cut the free side's count, from the limited side's ~40 ms.
    assert quantiles[0.5] <= result.summary["p99_ms"]
    table = prometheus.summary_table(text, "cost_model")
    assert list(table.columns) == ["request", "queue", "compute_infer"]
    with pytest.raises(StatisticsError, match="summary_latencies"):
        prometheus.summary_quantiles(text, "no_such_model")


#: 40 ms a request, not the committed 10, for the two timing checks below: the client's own time per request
#: (here ~1 ms; a busy CI machine's slow moments, ~4 ms a request and more) then stays small next to the
#: model's, so what they compare is the model's cost, not the client's speed.
SLOW = {"parameters": {"fixed_ms": {"string_value": "40"}}}


def test_cache_hits_skip_the_model(server) -> None:
    apply_config(server, "cost_model", SLOW)
    caching.enable_cache(server, "cost_model")
    assert server.model_config("cost_model").response_cache.enable
    run = caching.cache_experiment(server, "cost_model", {"INPUT0": X}, rounds=8)
    counts = run.counts
    assert (counts.hits, counts.misses) == (8, 8)
    assert counts.inferences == 8 and counts.executions == 8  # only the misses reached the model
    assert counts.hit_ms > 0 and counts.miss_ms > 0
    repeats = run.requests[run.requests["kind"] == "repeat"]
    assert all(np.array_equal(o["OUTPUT0"], X) for o in repeats["outputs"])  # the cached answer is right
    # A miss sleeps 40 ms in the model; a hit skips it. Both pay the client's time (t): (t + ~1) < (t + 41) / 2
    # holds up to t = 39 ms a request. At 10 ms it held only up to t = 9 ms.
    assert run.median_ms("repeat") < 0.5 * run.median_ms("new")
    with pytest.raises(LoadSettingError):
        caching.cache_experiment(server, "cost_model", {"INPUT0": X}, rounds=0)


def test_rate_limiter_makes_instances_take_turns(server) -> None:
    assert caching.server_resources(server) == {"R": 1}
    apply_config(server, "cost_model", SLOW)  # rate_limited keeps it: it edits the live config
    results = {}
    for label, resources in (("free", None), ("limited", {"R": 1})):
        config = caching.rate_limited(server, "cost_model", instances=2, resources=resources)
        assert config.instance_group[0].count == 2 and not config.HasField("dynamic_batching")
        results[label] = loadgen.run_closed(server, "cost_model", concurrency=4, inputs={"INPUT0": X},
                                         requests=1000, duration_s=2.0, warmup_requests=8)
    served = server.model_config("cost_model").instance_group[0].rate_limiter.resources
    assert [(r.name, r.count) for r in served] == [("R", 1)]
    free, limited = (results[k] for k in ("free", "limited"))
    assert free.server.avg_batch == limited.server.avg_batch == 1.0
    # Two instances in parallel vs one at a time: 2x apart while the server is what limits both runs. At 40 ms a
    # request with 4 in flight, free serves ~50 req/s and limited ~25 whatever the client does, as long as its
    # time per request (t) stays under 20 ms (one serial client loop at 50/s; 4 in flight / (40 ms + t) >= 50/s
    # needs t <= 40 ms). At the committed 10 ms, free's ~196 req/s needed t under 5 ms, and CI's slow moments
    # come close to that (~4 ms a request: test_load's sweep, 33 ms a round of 8). Measured here at 40 ms: 2.06x,
    # 2.01x beside a one-core hog (at 10 ms: 2.08x, 1.98x).
    assert limited.summary["throughput_rps"] * 1.4 < free.summary["throughput_rps"], (free.summary, limited.summary)
    assert limited.server.queue_ms > free.server.queue_ms
    with pytest.raises(LoadSettingError):
        caching.rate_limited(server, "cost_model", instances=0)


def test_statistics_errors_name_the_model_and_the_fix(server) -> None:
    """A refused statistics call says what Triton answered and what to check, for both causes."""
    with pytest.raises(StatisticsError, match=r"HTTP 400 for the statistics of 'no_such_model'.*Is the model loaded"):
        stats.fetch_statistics(server, "no_such_model")
    # The same server seen by a client that lacks the admin key (the one path every reader takes).
    with pytest.raises(StatisticsError, match=r"HTTP 403 .*admin key"):
        endpoints.statistics_payload(server.http_url, "cost_model", {})
    assert stats.fetch_statistics(server, "cost_model")["model_stats"][0]["name"] == "cost_model"
    assert server.statistics("cost_model")["model_stats"][0]["name"] == "cost_model"


def test_rows_since_waits_for_the_release_and_no_longer(server) -> None:
    """Triton counts a request at release, after the response: rows_since waits for it, within a bound."""
    import time

    from lab_backends.client.infer import infer

    before = stats.inference_count(server, "cost_model")
    fresh = np.random.default_rng().random((3, 16), dtype=np.float32)  # never a response-cache hit
    infer(server, "cost_model", {"INPUT0": fresh})
    assert stats.rows_since(server, "cost_model", before, 3) == 3
    start = time.monotonic()
    assert stats.rows_since(server, "cost_model", before, 10, wait_s=0.3) == 3  # the real count, after the wait
    assert 0.3 <= time.monotonic() - start < 5
