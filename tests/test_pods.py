"""The remote target against a multi-replica Triton: two embedded servers stand in for two pods.

Both are started as deploy/triton runs its pods: statistics open (learners have no admin key),
one trace folder per pod (``<dir>/<pod>/trace.json``). The remote target gets both in
``TRITON_URL``; statistics must be the sum of the two, and a request's trace must come from the
pod that served it, never from the other one (trace ids restart at 1 on every pod).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from lab_backends.client.infer import infer
from lab_backends.errors import TraceError
from lab_backends.measure import pods, stats, trace
from lab_backends.server import endpoints
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll

#: What deploy/triton restricts on the shared server (statistics stay open).
SHARED_RESTRICTED = ("model-repository", "trace", "shared-memory", "logging")


@pytest.fixture(scope="module")
def two_pods(tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    started = []
    try:
        for pod in ("triton-0", "triton-1"):
            server = TritonServer(models=["echo"], target="local", trace_file=traces / pod / "trace.json",
                                  trace_log_frequency=1, restricted_apis=SHARED_RESTRICTED)
            (traces / pod).mkdir()
            started.append(server.start())
        yield started, traces
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def remote(two_pods, monkeypatch):
    (a, b), traces = two_pods
    monkeypatch.delenv("TRITON_ADMIN_KEY", raising=False)
    monkeypatch.delenv("TRITON_PODS", raising=False)
    monkeypatch.setenv("TRITON_TRACE_FILE", str(traces / "{pod}" / "trace.json"))
    monkeypatch.setenv("TRITON_METRICS_URL", f"{a.metrics_url},{b.metrics_url}")  # pods on one host: own ports
    server = TritonServer(url=f"http://{a.http_url}, http://{b.http_url}").start()
    yield server
    server.stop()


def _count(payload: dict) -> int:
    return stats.totals(payload, "echo").success[0]


@pytest.mark.server
def test_statistics_are_summed_over_the_pods(two_pods, remote) -> None:
    (a, b), _ = two_pods
    assert remote.target == "remote" and remote.http_url == a.http_url  # the first pod serves inference
    assert [e.http_url for e in remote.endpoints] == [a.http_url, b.http_url]
    before = {s.http_url: _count(stats.fetch_statistics(s, "echo")) for s in (a, b)}
    x = np.ones(4, np.float32)
    for _ in range(3):
        infer(a, "echo", {"INPUT0": x})
    for _ in range(5):
        infer(b, "echo", {"INPUT0": x})
    total_before = sum(before.values())
    summed = poll(lambda: _count(stats.fetch_statistics(remote, "echo")), lambda n: n >= total_before + 8, 5.0, 0.05)
    assert summed == total_before + 8
    per_pod = [_count(stats.fetch_statistics(s, "echo")) - before[s.http_url] for s in (a, b)]
    assert per_pod == [3, 5]
    # Prometheus, summed the same way (counters per model label, added over the pods).
    def success(server) -> float:
        page = stats.parse_metrics(stats.scrape_metrics(server))
        return sum(v for (name, labels), v in page.samples.items()
                   if name == "nv_inference_request_success" and ("model", "echo") in labels)

    assert poll(lambda: success(remote), lambda v: v == success(a) + success(b), 5.0, 0.1) == success(a) + success(b)
    assert success(remote) >= success(b) + 3 > success(b)
    # TritonServer.statistics (tritonclient, one pod otherwise) and the window arithmetic agree.
    assert _count(remote.statistics("echo")) == summed
    assert stats.totals(remote.statistics("echo"), "echo").executions >= 8


@pytest.mark.server
def test_trace_comes_from_the_pod_that_served_it(two_pods, remote) -> None:
    (a, b), traces = two_pods
    run = uuid.uuid4().hex[:8]
    x = np.arange(4, dtype=np.float32)
    infer(a, "echo", {"INPUT0": x}, protocol="http", request_id=f"{run}-on-0")
    infer(b, "echo", {"INPUT0": x}, protocol="http", request_id=f"{run}-on-1")
    assert pods.which_pod(remote.trace_file, f"{run}-on-1") == "triton-1"
    assert pods.which_pod(remote.trace_file, f"{run}-on-0") == "triton-0"
    log = trace.read_trace(remote.trace_file, request_ids=[f"{run}-on-1"])
    ids = set(log.requests["request_id"].dropna())
    assert f"{run}-on-1" in ids and f"{run}-on-0" not in ids  # one pod's file, never merged
    assert log.request(f"{run}-on-1")["model"] == "echo"
    with pytest.raises(TraceError, match="several pods|no single pod"):
        pods.pod_trace_file(remote.trace_file, [f"{run}-on-0", f"{run}-on-1"], timeout_s=0.3)
    with pytest.raises(TraceError, match="request_ids"):
        trace.read_trace(remote.trace_file)


def test_endpoints_from_a_list_and_from_a_headless_name() -> None:
    assert endpoints.split_urls("http://a:8000, http://b:8000/") == ["a:8000", "b:8000"]
    assert endpoints.primary_url("http://a:8000,http://b:8000") == "http://a:8000"
    listed = endpoints.pod_endpoints("http://triton-0.pods.ns.svc:8000,http://triton-1.pods.ns.svc:8000", env={})
    assert [(e.pod, e.http_url) for e in listed] == [("triton-0", "triton-0.pods.ns.svc:8000"),
                                                      ("triton-1", "triton-1.pods.ns.svc:8000")]
    assert endpoints.pod_endpoints("http://one:8000", env={}) == []
    assert endpoints.pod_metrics_url(listed[1], "http://triton.ns.svc:8002/metrics") == \
        "http://triton-1.pods.ns.svc:8002/metrics"
    # A headless Service answers one address per pod; "localhost" stands in for it here.
    (local,) = endpoints.pod_endpoints("http://svc:9000", env={"TRITON_PODS": "localhost"})[:1]
    assert local.http_url.endswith(":9000")


def test_shared_server_lessons_fall_back_to_the_embedded_server() -> None:
    said: list[str] = []
    shared = {"TRITON_URL": "http://triton:8000"}
    assert endpoints.fallback_target("model-control", shared, said.append) == "local"
    assert "embedded" in said[0] and "whole class" in said[0]
    assert endpoints.fallback_target("c-backend", {**shared, "TRITON_ADMIN_KEY": "k"}, said.append) is None
    assert endpoints.fallback_target("config-override", {}, said.append) is None
    with pytest.raises(Exception, match="choose one of"):
        endpoints.fallback_target("nope", shared)


@pytest.mark.server
def test_footprint_sampler_sees_both_servers_and_their_requests(two_pods) -> None:
    """The sampler behind docs/scale.md, on this test process's own servers."""
    import os

    from lab_backends.measure.footprint import Sampler

    (a, b), _ = two_pods
    sampler = Sampler(os.getpid())
    sampler.sample()
    for _ in range(4):
        infer(b, "echo", {"INPUT0": np.ones(4, np.float32)})
    poll(lambda: sampler.sample() or sampler.fp.requests.get("echo", 0), lambda n: n >= 4, 5.0, 0.1)
    result = sampler.result()
    assert result.servers == 2 and result.peak_server_rss_mb > 0
    assert result.requests["echo"] >= 4 and result.stream[-1][1] == "echo"
