"""lab_backends.lessons.frameworks against a real server: the three wrapped frameworks agree (digits_tf
with digits_torch on every held-out digit), loads and thread timings produce sane rows, each
framework's stub is measured, and a CPU server is reported as GPU-less.

One server for the module, started with nothing loaded: the models are loaded one at a time by
``framework_costs.load_each``, as notebook 05 does (one digits_tf instance: the heaviest stub here)."""

from __future__ import annotations

import numpy as np
import pytest

from lab_backends.digits import reference
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import framework_costs, frameworks
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
