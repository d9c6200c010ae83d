"""lab_backends.lessons.frameworks against a real server: the two wrapped frameworks agree, loads and
thread timings produce sane rows, a CPU server is reported as GPU-less, and the notebook-05
exercise accepts its solution and rejects wrong answers."""

from __future__ import annotations

import numpy as np
import pytest

from lab_backends.digits import reference
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import frameworks
from lab_backends.server.triton_server import TritonServer

MODELS = list(frameworks.WRAPPED.values())


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=MODELS, target="local") as started:
        yield started


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


def test_gpu_status_messages_say_what_is_skipped() -> None:
    no_native = frameworks.GpuStatus(True, ["1 GPU(s) in nv_gpu_* metrics"], [], {"digits_onnx_gpu": "UNAVAILABLE"})
    assert not no_native.can_compare and "SKIPPING" in no_native.message() and "digits_onnx_gpu" in no_native.message()
    ready = frameworks.GpuStatus(True, ["KIND_GPU models ready: digits_torch_gpu"], ["digits_torch_gpu"])
    assert ready.can_compare and "comparing digits_torch_gpu" in ready.message()
    assert frameworks.served("digits_torch_gpu").input == "PIXELS__0"
