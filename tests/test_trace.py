"""lab_backends.measure.trace: unit tests on trace files recorded from a real tritonserver 2.51
(tests/data/traces, made by tests/record_traces.py), then one integration run against a live server.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from trace_models import BLS, CACHED, ENSEMBLE, write_cached_model, write_trace_models

from lab_backends.client.infer import infer
from lab_backends.errors import TraceError
from lab_backends.measure import trace
from lab_backends.measure.plots_trace import stage_bars, waterfall
from lab_backends.paths import MODEL_REPOSITORY

DATA = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def recorded() -> trace.TraceLog:
    return trace.read_trace(DATA / "all.json")


def row(log: trace.TraceLog, request_id: str):
    return log.request(request_id)


# ------------------------------------------------------------------ files
def test_reads_parts_in_numeric_order(tmp_path: Path) -> None:
    for i in (0, 1, 2):
        shutil.copy(DATA / f"split.json.{i}", tmp_path / f"t.json.{i}")
    shutil.copy(DATA / "split.json.0", tmp_path / "t.json.10")
    assert [p.name for p in trace.trace_files(tmp_path / "t.json")] == ["t.json.0", "t.json.1", "t.json.2", "t.json.10"]
    # a file named like a part of another trace is not ours
    (tmp_path / "t.json.x").write_text("[]")
    (tmp_path / "other.json.0").write_text("[]")
    assert len(trace.trace_files(tmp_path / "t.json")) == 4


def test_split_files_parse_like_one(tmp_path: Path) -> None:
    log = trace.read_trace(DATA / "split.json", expect=3)
    assert list(log.requests["request_id"]) == ["split-http", "split-grpc", "split-http"]
    assert list(log.requests["protocol"]) == ["http", "grpc", "http"]


def test_missing_and_partial_files_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no trace file"):
        trace.read_records(tmp_path / "none.json")
    (tmp_path / "half.json").write_text('[{"id":1,"timestamps":[{"name":"REQUEST_START"')
    with pytest.raises(TraceError, match="not a complete JSON array"):
        trace.read_records(tmp_path / "half.json")
    with pytest.raises(TraceError, match="only 1 of 5 requests"):
        trace.read_trace(DATA / "split.json.0", expect=5, timeout_s=0.3)
    with pytest.raises(TraceError, match="not .yet. complete"):
        trace.read_trace(DATA / "split.json", request_ids=["nope"], timeout_s=0.3)


def test_records_order_does_not_matter(recorded: trace.TraceLog, tmp_path: Path) -> None:
    records = json.loads((DATA / "all.json").read_text())
    shuffled = tmp_path / "shuffled.json"
    shuffled.write_text(json.dumps(list(reversed(records))))
    again = trace.read_trace(shuffled)
    cols = ["trace_id", "request_id", "total_ms", "queue_ms", "infer_ms"]
    a = recorded.requests[cols].sort_values("trace_id").reset_index(drop=True)
    b = again.requests[cols].sort_values("trace_id").reset_index(drop=True)
    assert a.equals(b)


# ------------------------------------------------------------------ stages
def test_http_request_has_every_stage_from_its_stamps(recorded: trace.TraceLog) -> None:
    r = row(recorded, "http-1")
    stamps = recorded.stamps[recorded.stamps["trace_id"] == r["trace_id"]].set_index("name")["ns"]
    assert r["protocol"] == "http"
    assert r["receive_ms"] == pytest.approx((stamps["REQUEST_START"] - stamps["HTTP_RECV_START"]) / 1e6)
    assert r["queue_ms"] == pytest.approx((stamps["COMPUTE_START"] - stamps["QUEUE_START"]) / 1e6)
    assert r["infer_ms"] == pytest.approx((stamps["COMPUTE_OUTPUT_START"] - stamps["COMPUTE_INPUT_END"]) / 1e6)
    assert r["send_ms"] == pytest.approx((stamps["HTTP_SEND_END"] - stamps["HTTP_SEND_START"]) / 1e6)
    assert r["infer_ms"] >= 10.0  # cost_model sleeps fixed_ms = 10
    stages = recorded.stages[recorded.stages["trace_id"] == r["trace_id"]]
    assert list(stages["stage"]) == list(trace.STAGES)
    assert (stages["duration_ms"] >= 0).all()


def test_grpc_receive_ignores_waitread_start(recorded: trace.TraceLog) -> None:
    r = row(recorded, "grpc-1")
    stamps = recorded.stamps[recorded.stamps["trace_id"] == r["trace_id"]].set_index("name")["ns"]
    assert r["protocol"] == "grpc"
    # GRPC_WAITREAD_START is when the front end began waiting: long before the request (here too).
    assert stamps["GRPC_WAITREAD_START"] < r["start_ns"]
    assert r["receive_ms"] == pytest.approx((stamps["REQUEST_START"] - stamps["GRPC_WAITREAD_END"]) / 1e6)
    assert r["start_ns"] == stamps["GRPC_WAITREAD_END"]
    assert r["total_ms"] < 1000


def test_burst_shows_queued_and_unqueued_requests(recorded: trace.TraceLog) -> None:
    burst = recorded.requests[recorded.requests["request_id"].fillna("").str.startswith("burst")]
    assert len(burst) == 6
    first = burst.loc[burst["queue_ms"].idxmin()]
    assert first["queue_ms"] < 1.0
    assert burst["queue_ms"].max() > 5.0
    # The queued ones ran together: one batch, identical compute stamps.
    queued = burst[burst["queue_ms"] > 5.0]
    assert queued["infer_ms"].nunique() == 1


def test_ensemble_children_carry_parent_id(recorded: trace.TraceLog) -> None:
    parent = recorded.request("ensemble-1", model=ENSEMBLE)
    kids = recorded.children(int(parent["trace_id"]))
    assert list(kids["model"]) == ["cost_model", "cost_model"]
    assert (kids["parent_id"] == parent["trace_id"]).all()
    assert list(kids["depth"]) == [1, 1]
    assert sorted(parent["children"]) == sorted(kids["trace_id"])
    # The ensemble itself runs no backend: a pipeline span instead of compute stages.
    fam = recorded.family(int(parent["trace_id"]))
    parent_stages = set(fam.loc[fam["trace_id"] == parent["trace_id"], "stage"])
    assert parent_stages == {"receive", "pipeline", "send"}
    assert np.isnan(parent["queue_ms"]) and not parent["cache_hit"]
    assert set(fam["root_id"]) == {parent["trace_id"]}


def test_bls_child_and_select(recorded: trace.TraceLog) -> None:
    parent = recorded.request("bls-1", model=BLS)
    kids = recorded.children(int(parent["trace_id"]))
    assert list(kids["model"]) == ["cost_model"]
    assert kids.iloc[0]["start_ns"] >= parent["start_ns"] and kids.iloc[0]["end_ns"] <= parent["end_ns"]
    sub = recorded.select(["bls-1"])
    assert set(sub.requests["trace_id"]) == {parent["trace_id"], kids.iloc[0]["trace_id"]}
    assert set(sub.stamps["trace_id"]) == set(sub.requests["trace_id"])


def test_cache_hit_has_cache_stage_and_no_compute(recorded: trace.TraceLog) -> None:
    hit, miss = recorded.request("cache-hit", model=CACHED), recorded.request("cache-miss", model=CACHED)
    assert hit["cache_hit"] and not miss["cache_hit"]
    assert np.isnan(hit["infer_ms"]) and miss["infer_ms"] >= 10.0
    assert hit["total_ms"] < miss["total_ms"]
    stages = set(recorded.stages.loc[recorded.stages["trace_id"] == hit["trace_id"], "stage"])
    assert stages == {"receive", "cache", "send"}


def test_unknown_request_id_says_what_is_known(recorded: trace.TraceLog) -> None:
    with pytest.raises(TraceError, match="http-1"):
        recorded.request("no-such-id")


def test_summary_and_plots(recorded: trace.TraceLog) -> None:
    summary = recorded.summary()
    assert summary.loc["cost_model", "infer_ms"] >= 10.0
    ax = waterfall(recorded.family(int(recorded.request("ensemble-1")["trace_id"])), title="t")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith(ENSEMBLE) and all("└ cost_model" in lab for lab in labels[1:])
    assert len(ax.patches) == len(recorded.family(int(recorded.request("ensemble-1")["trace_id"])))
    assert stage_bars(recorded.requests) is not None
    with pytest.raises(TraceError, match="empty"):
        waterfall(recorded.stages.iloc[0:0])


# ------------------------------------------------------------------ a live server
@pytest.mark.server
def test_live_trace_http_grpc_ensemble_bls_and_settings(start_server, tmp_path: Path) -> None:
    repo = write_cached_model(write_trace_models(tmp_path / "repo"), MODEL_REPOSITORY / "cost_model")
    path = tmp_path / "trace.json"
    server = start_server(model_repository=[MODEL_REPOSITORY, repo], models=["cost_model", ENSEMBLE, BLS],
                          trace_file=path, trace_log_frequency=1)
    assert trace.trace_settings(server)["trace_file"] == str(path)
    with pytest.raises(TraceError, match="403"):
        trace.trace_settings(server, use_key=False)
    x = np.ones((1, 16), np.float32)
    infer(server, "cost_model", {"INPUT0": x}, protocol="http", request_id="h")
    infer(server, "cost_model", {"INPUT0": x}, protocol="grpc", request_id="g")
    infer(server, ENSEMBLE, {"INPUT0": x}, protocol="http", request_id="e")
    infer(server, BLS, {"INPUT0": x}, protocol="grpc", request_id="b")
    # No batcher (one request at a time) and 100 ms each: whatever the client's timing, all but the
    # first request of the burst to reach the instance wait >= 100 ms; batched, they could all share one batch.
    slow = server.model_config("cost_model")
    slow.parameters["fixed_ms"].string_value = "100"
    slow.ClearField("dynamic_batching")
    server.load_model("cost_model", config=slow)
    ids = trace.send_burst(server, "cost_model", {"INPUT0": x}, 5, prefix="q")
    log = trace.read_trace(path, request_ids=["h", "g", "e", "b", *ids])
    assert log.request("h")["protocol"] == "http" and log.request("g")["protocol"] == "grpc"
    assert len(log.children(int(log.request("e")["trace_id"]))) == 2
    assert list(log.children(int(log.request("b")["trace_id"]))["model"]) == ["cost_model"]
    queues = log.select(ids).requests["queue_ms"]
    assert queues.max() > 90.0 and queues.min() < queues.max() / 2

    # Runtime settings: trace every second request from now on.
    settings = trace.update_trace_settings(server, trace_rate=2)
    assert settings["trace_rate"] == "2"
    before = int((log.requests["depth"] == 0).sum())
    for i in range(4):
        infer(server, "cost_model", {"INPUT0": x}, request_id=f"r{i}")
    after = trace.read_trace(path, expect=before + 2)
    assert len(after.requests[after.requests["request_id"].fillna("").str.match(r"^r\d$")]) == 2
    with pytest.raises(TraceError, match="HTTP 4|HTTP 5"):
        trace.update_trace_settings(server, trace_file=str(tmp_path / "elsewhere.json"))


@pytest.mark.server
def test_live_trace_written_at_shutdown(start_server, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    server = start_server(models=["cost_model"], trace_file=path)  # log_frequency 0: written on stop
    infer(server, "cost_model", {"INPUT0": np.ones((2, 16), np.float32)}, request_id="late")
    assert not trace.trace_files(path)
    server.stop()
    log = trace.read_trace(path, request_ids=["late"], timeout_s=5)
    assert log.request("late")["infer_ms"] >= 10.0
