"""lab_backends.lessons.frameworks against a real server: the three wrapped frameworks agree (digits_tf
with digits_torch on every held-out digit), loads and thread timings produce sane rows, each
framework's stub is measured, and a CPU server is reported as GPU-less.

One server for the module, started with nothing loaded: the models are loaded one at a time by
``framework_costs.load_each``, as notebook 05 does (one digits_tf instance: the heaviest stub here)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab_backends.digits import reference
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import framework_costs, framework_reading, frameworks
from lab_backends.notebook import check_measured
from lab_backends.server.triton_server import TritonServer

MODELS = list(frameworks.WRAPPED.values())


@pytest.fixture(scope="module")
def started():
    with TritonServer(models=[], target="local") as server:
        yield server, framework_costs.load_each(server, MODELS)


@pytest.fixture(scope="module")
def server(started):
    return started[0]


@pytest.fixture(scope="module")
def data():
    return frameworks.held_out()


@pytest.mark.server
def test_wrapped_frameworks_agree_on_every_held_out_image(server, data) -> None:
    images, labels, pixels = data
    logits = {m: frameworks.served_logits(server, m, pixels) for m in MODELS}
    cmp = frameworks.agreement(logits["digits_torch"], logits["digits_onnx"], labels)
    assert cmp["rows"] == len(images) > 64  # more than one request each
    assert cmp["max_abs_diff"] < 1e-5 and cmp["same_labels"], cmp
    assert cmp["accuracy_a"] > 0.9
    np.testing.assert_allclose(logits["digits_onnx"], reference.onnx_logits(pixels), atol=1e-6)
    table = frameworks.compare_table(logits, "digits_torch", labels)
    assert table.loc["digits_torch", "max_abs_diff_vs_digits_torch"] == 0.0


@pytest.mark.server
def test_digits_tf_serves_the_same_digits_as_digits_torch(server, data) -> None:
    """Every held-out digit through both served models: the same class, logits within 1e-4."""
    _, labels, pixels = data
    tf_out = frameworks.served_logits(server, "digits_tf", pixels)
    torch_out = frameworks.served_logits(server, "digits_torch", pixels)
    assert tf_out.shape == torch_out.shape == (len(pixels), 10) and tf_out.dtype == np.float32
    assert (tf_out.argmax(1) == torch_out.argmax(1)).all()
    assert np.abs(tf_out - torch_out).max() < 1e-4
    assert (tf_out.argmax(1) == labels).mean() > 0.9


@pytest.mark.server
def test_digits_tf_errors_are_per_request(server, data) -> None:
    """A NaN request gets its own error; the same model still answers the next request."""
    from lab_backends.client.infer import infer

    bad = data[2][:2].copy()
    bad[1, 3] = np.nan
    with pytest.raises(Exception, match="NaN or infinity"):
        infer(server, "digits_tf", {"PIXELS": bad})
    assert infer(server, "digits_tf", {"PIXELS": data[2][:2]})["LOGITS"].shape == (2, 10)


@pytest.mark.server
def test_each_framework_stub_is_timed_and_measured(started) -> None:
    server, costs = started
    assert list(costs.index) == MODELS and list(costs["framework"]) == ["torch", "onnx", "tf"]
    assert (costs["load_s"] > 0).all() and (costs["instances"] == 1).all()
    rss = costs["rss_mb_per_instance"]
    # Memory, not time: stable from run to run (measured 299 / 94 / 717 MB).
    assert rss["digits_tf"] > rss["digits_torch"] > rss["digits_onnx"] > 30
    assert (costs["threads_per_instance"] >= 1).all()
    again = framework_costs.load_each(server, MODELS)  # already READY: nothing reloaded, nothing timed
    assert again["load_s"].isna().all() and (again["instances"] == 1).all()


@pytest.mark.server
def test_a_chunk_over_max_batch_size_is_refused(server, data) -> None:
    with pytest.raises(Exception, match="batch"):
        frameworks.served_logits(server, "digits_onnx", data[2][:65], max_batch=65)
    with pytest.raises(LabBackendsError, match="not a digits framework model"):
        frameworks.served_logits(server, "cost_model", data[2][:1])


@pytest.mark.server
def test_side_by_side_rows(server) -> None:
    frame = frameworks.side_by_side(server, MODELS, concurrencies=(2,), duration_s=0.5, requests=60, warmup_requests=4)
    assert frame["config"].tolist() == MODELS
    assert (frame["errors"] == 0).all() and (frame["ok"] > 0).all()
    assert (frame["server_requests"] == frame["ok"]).all()  # the server's window covers the same requests


@pytest.mark.server
def test_cpu_server_is_reported_without_gpu(server) -> None:
    status = frameworks.gpu_status(server)
    assert not status.has_gpu and not status.can_compare and status.native_ready == []
    assert "NO GPU" in status.message() and "SKIPPING" in status.message()
    kinds = frameworks.instance_kinds(server, MODELS)
    assert set(kinds["instances"]) == {"KIND_CPU x1"} and set(kinds["backend"]) == {"python"}


@pytest.mark.server
def test_gpu_status_without_the_admin_key_asks_each_model(server) -> None:
    """A learner on a class's shared server has no admin key: the repository index is refused (403),
    so the GPU check falls back to the open per-model readiness endpoint instead of failing."""
    from lab_backends.server.triton_server import TritonServer

    learner = TritonServer(url=f"http://{server.http_url}", grpc_url=server.grpc_url, target="remote",
                           admin_key="not-the-key").start()
    with pytest.raises(Exception, match="403"):
        learner.repository_index()
    status = frameworks.gpu_status(learner)
    assert not status.has_gpu and status.native_ready == [] and "NO GPU" in status.message()


def test_thread_timings_same_answer_any_thread_count() -> None:
    import torch

    before = torch.get_num_threads()
    frame = frameworks.thread_timings(threads=(1, 2), batches=(1, 8), repeats=3)
    assert len(frame) == 8 and (frame["us_per_call"] > 0).all()
    assert frame["max_abs_diff_vs_first"].max() < 1e-5
    assert torch.get_num_threads() == before
    pins = frameworks.pinning_lines()
    assert any("set_num_threads(1)" in ln for ln in pins["digits_torch"])
    assert any("intra_op_num_threads = 1" in ln for ln in pins["digits_onnx"])
    assert any("set_intra_op_parallelism_threads(1)" in ln for ln in pins["digits_tf"])
    assert any("set_inter_op_parallelism_threads(1)" in ln for ln in pins["digits_tf"])


def test_summary_puts_costs_beside_speed() -> None:
    import pandas as pd

    costs = pd.DataFrame({"framework": ["torch", "tf"], "load_s": [2.0, 4.0], "rss_mb_per_instance": [300.0, 700.0],
                          "threads_per_instance": [4.0, 7.0]}, index=["digits_torch", "digits_tf"])
    speed = pd.DataFrame({"config": ["digits_torch", "digits_tf"] * 2, "concurrency": [1, 1, 8, 8],
                          "p50_ms": [3.0, 4.0, 9.0, 10.0], "throughput_rps": [300.0, 250.0, 800.0, 600.0],
                          "avg_batch": [1.0, 1.0, 7.0, 6.0]})
    table = framework_costs.summary(costs, speed)
    assert table.loc["digits_tf", "p50_ms_c1"] == 4.0 and table.loc["digits_torch", "throughput_rps_c8"] == 800.0
    assert table.loc["digits_tf", "avg_batch_c8"] == 6.0 and table.loc["digits_tf", "rss_mb_per_instance"] == 700.0


def test_footprint_of_a_server_not_started_here_is_not_measured() -> None:
    class Remote:
        target, pid = "remote", None

    frame = framework_costs.stub_footprint(Remote(), MODELS)
    assert list(frame.index) == MODELS and (frame["instances"] == 0).all()
    assert frame["rss_mb_per_instance"].isna().all()


def test_gpu_status_messages_say_what_is_skipped() -> None:
    no_native = frameworks.GpuStatus(True, ["1 GPU(s) in nv_gpu_* metrics"], [], {"digits_onnx_gpu": "UNAVAILABLE"})
    assert not no_native.can_compare and "SKIPPING" in no_native.message() and "digits_onnx_gpu" in no_native.message()
    ready = frameworks.GpuStatus(True, ["KIND_GPU models ready: digits_torch_gpu"], ["digits_torch_gpu"])
    assert ready.can_compare and "comparing digits_torch_gpu" in ready.message()
    assert frameworks.served("digits_torch_gpu").input == "PIXELS__0"


@pytest.mark.server
def test_the_busy_remeasure_runs_when_forced(server, capsys) -> None:
    """Notebook 05 re-measures its batching claim only after a miss: force the miss, run the real windows."""
    missed = pd.DataFrame({"config": MODELS, "concurrency": [4] * 3, "avg_batch": [0.0] * 3})  # below 0.5: a miss
    again = check_measured("batches merged", missed, lambda b: b["avg_batch"].min(), above=0.5,
                           remeasure=framework_reading.busy_again(server, MODELS, 4, 0.25))
    assert "re-measuring once" in capsys.readouterr().out
    assert again["config"].tolist() == MODELS and (again["concurrency"] == 4).all()
    assert (again["errors"] == 0).all() and (again["ok"] > 0).all()


@pytest.mark.server
def test_where_time_goes_splits_a_request_from_the_servers_numbers(server) -> None:
    """The split notebook 05 prints: the server's stages for one request in flight, the framework call beside them."""
    frame = frameworks.side_by_side(server, MODELS, concurrencies=(1,), duration_s=0.5, requests=40, warmup_requests=4)
    calls = frameworks.thread_timings(threads=(1,), batches=(1,), repeats=5)
    split = framework_reading.where_time_goes(frame, calls)
    assert list(split.index) == MODELS
    assert np.isnan(split.loc["digits_tf", "framework_call_ms"])
    assert (split.loc[MODELS[:2], "framework_call_ms"] > 0).all()
    assert (split["compute_infer_ms"] < split["latency_ms"]).all() and (split["outside_server_ms"] > 0).all()
    delay = framework_reading.batcher_delay_ms(server, "digits_onnx")
    assert delay == 2.0 and (split["queue_ms"] >= 0.9 * delay).all(), split["queue_ms"]
    lines = framework_reading.time_lines(split)
    assert len(lines) == 5 and "not timed alone" in lines[2] and "took" in lines[-1]


def test_readings_follow_the_numbers_not_a_script() -> None:
    index = pd.MultiIndex.from_tuples([("onnx", 64), ("onnx", 1), ("torch", 1)], names=["framework", "batch"])
    table = pd.DataFrame({"2 threads / 1 thread": [0.5, 1.05, 2.0]}, index=index)
    lines = framework_reading.thread_lines(table)
    assert "helped: 2.0x faster" in lines[0] and "no difference" in lines[1] and "cost time: 2.0x slower" in lines[2]
    split = pd.DataFrame({"latency_ms": [4.0, 5.0], "queue_ms": [2.0, 2.0], "compute_infer_ms": [1.0, 2.0],
                          "framework_call_ms": [1.2, float("nan")], "compute_infer_share": [0.25, 0.4]},
                         index=["digits_torch", "digits_tf"])
    split["framework_share"] = split["framework_call_ms"] / split["latency_ms"]
    split["stub_and_model_py_ms"] = split["compute_infer_ms"] - split["framework_call_ms"]
    lines = framework_reading.time_lines(split)
    assert "~1.20 ms (30% of the request): more than compute_infer itself" in lines[0]
    assert "took 30%-30% of a request here (digits_torch)" in lines[2]
    assert "1.25x the fastest's (digits_torch, 4.00 ms)" in lines[3]
    costs = pd.DataFrame({"rss_mb_per_instance": [90.0, 700.0]}, index=["digits_onnx", "digits_tf"])
    foot = framework_reading.footprint_lines(costs, pd.Series({"digits_onnx": 16.6, "digits_tf": 16.6}))
    assert "stub 700 MB resident (683 MB more" in foot[1] and "~1400 MB before any request" in foot[2]
    sizes = framework_reading.artifact_mb(MODELS)
    assert (sizes > 1).all() and sizes.max() / sizes.min() < 1.1, "the same weights, three files of about one size"
