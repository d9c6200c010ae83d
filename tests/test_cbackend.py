"""C backends through the backend C API, against the real tritonserver.

Both backends are compiled from source here (into a temporary backend directory, so the test never
depends on what ``setup`` left in build/), loaded by a real server, and checked for: results of
batched and of concurrent requests, error responses that leave the server serving, statistics
that show batching, a trace with the timestamps the backend reports, bounded server memory over
10k requests, and build-time failure of a misspelled API name.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.errors import BackendBuildError
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend
from lab_backends.server.repository import ModelConfig, config_text, read_config
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server
C_MODELS = ["c_scale", "digits_preprocess_c"]
#: Test-only variants of c_scale, served from a temporary repository.
TEST_MODELS = ["c_scale_default", "c_scale_triple", "c_scale_fp64", "c_scale_bad_factor"]


def _scale_config(name: str, factor: str | None, dtype: str = "TYPE_FP32") -> ModelConfig:
    """A c_scale variant, built through the protobuf schema (no string templates)."""
    config = ModelConfig(name=name, backend="scale", max_batch_size=64)
    config.input.add(name="INPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.DataType.Value(dtype), dims=[-1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.dynamic_batching.SetInParent()
    if factor is not None:
        config.parameters["factor"].string_value = factor
    return config


def _write_model(repo: Path, config: ModelConfig) -> None:
    folder = repo / config.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config_text(config))


def _stats_once_counted(server: TritonServer, model: str, field: str, target: int, timeout_s: float = 10.0) -> dict:
    """The model's statistics once ``field`` reached ``target``.

    Our Execute sends the responses first and reports statistics just before releasing the
    requests, so a client can hold its answer a few microseconds before the statistics count it.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.statistics(model)["model_stats"][0]
        value = stats["inference_stats"]["fail"]["count"] if field == "fail" else stats[field]
        if int(value) >= target or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


@pytest.fixture(scope="module")
def backend_dir(tmp_path_factory) -> Path:
    """Both C backends compiled from source right now, into a fresh backend directory."""
    target = tmp_path_factory.mktemp("backends")
    for name, source in cbackend.sources().items():
        cbackend.build(source, name, target)
    return target


@pytest.fixture(scope="module")
def server(backend_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("c_models")
    _write_model(repo, _scale_config("c_scale_default", None))
    _write_model(repo, _scale_config("c_scale_triple", "3"))
    _write_model(repo, _scale_config("c_scale_fp64", "2", dtype="TYPE_FP64"))
    _write_model(repo, _scale_config("c_scale_bad_factor", "two"))
    with TritonServer(
        [MODEL_REPOSITORY, repo],
        models=C_MODELS + TEST_MODELS,
        backend_dir=backend_dir,
        allow_broken_models=True,
    ) as srv:
        yield srv


# ---------------------------------------------------------------------------------- build
def test_both_backends_build_from_source_and_export_execute(backend_dir):
    # lab_iterative: test_continuous_batching_c; clip: notebook 09's exercise, whose reference it is
    assert set(cbackend.sources()) == {"scale", "digits_prep", "lab_iterative", "clip"}
    for name in ("scale", "digits_prep"):
        library = cbackend.library_path(name, backend_dir)
        assert library.is_file(), library
        exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        assert "TRITONBACKEND_ModelInstanceExecute" in exported
        assert "lab_gather_input" not in exported  # helpers stay hidden: only entry points are exported


def test_build_all_is_idempotent(tmp_path):
    first = cbackend.build_all(tmp_path)
    stamps = {name: path.stat().st_mtime_ns for name, path in first.items()}
    second = cbackend.build_all(tmp_path)
    assert {name: path.stat().st_mtime_ns for name, path in second.items()} == stamps
    assert not any(cbackend.is_stale(n, s, tmp_path) for n, s in cbackend.sources().items())


def test_misspelled_api_name_fails_at_build_time(tmp_path):
    source = tmp_path / "typo.c"
    source.write_text(
        '#include "lab_triton.h"\n'
        "TRITONSERVER_Error* TRITONBACKEND_ResponseSnd(TRITONBACKEND_Response*, uint32_t, TRITONSERVER_Error*);\n"
        "TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(\n"
        "    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {\n"
        "  (void)instance; (void)requests; (void)count;\n"
        "  return TRITONBACKEND_ResponseSnd(NULL, 1, NULL);\n"
        "}\n"
    )
    with pytest.raises(BackendBuildError) as info:
        cbackend.build(source, "typo", tmp_path / "backends")
    message = str(info.value)
    assert "undefined reference" in message and "TRITONBACKEND_ResponseSnd" in message
    assert "check its spelling" in message
    assert not cbackend.library_path("typo", tmp_path / "backends").exists()


def test_missing_entry_point_and_missing_compiler_are_clear(tmp_path):
    source = tmp_path / "noexec.c"
    source.write_text('#include "lab_triton.h"\nint helper(void) { return 1; }\n')
    with pytest.raises(BackendBuildError, match="does not export TRITONBACKEND_ModelInstanceExecute"):
        cbackend.build(source, "noexec", tmp_path)
    with pytest.raises(BackendBuildError, match="not found on PATH.*gcc"):
        cbackend.build(source, "noexec", tmp_path, compiler="no-such-cc-xyz")


def test_committed_configs_parse():
    assert read_config(MODEL_REPOSITORY / "c_scale").backend == "scale"
    assert read_config(MODEL_REPOSITORY / "digits_preprocess_c").backend == "digits_prep"
    ensemble = read_config(MODEL_REPOSITORY / "digits_ensemble_c")
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "digits_preprocess_c", "digits_onnx", "digits_postprocess"]


# ---------------------------------------------------------------------------------- load and infer
def test_backends_load_and_check_the_api_version(server):
    states = {m["name"]: m.get("state") for m in server.repository_index()}
    for name in C_MODELS + ["c_scale_default", "c_scale_triple", "c_scale_fp64"]:
        assert states.get(name) == "READY", (name, states.get(name))
    assert "scale: Triton backend API 1." in server.log_text()
    assert "digits_prep: Triton backend API 1." in server.log_text()


def test_bad_factor_fails_the_load_with_the_reason(server):
    reason = server.broken_models["c_scale_bad_factor"]
    assert "factor" in reason and "two" in reason


@pytest.mark.parametrize("model, factor", [("c_scale", 2.0), ("c_scale_default", 2.0), ("c_scale_triple", 3.0)])
def test_batched_request(server, model, factor):
    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    out = infer(server, model, {"INPUT0": x})["OUTPUT0"]
    assert out.shape == x.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, x * np.float32(factor))
    empty = infer(server, model, {"INPUT0": np.zeros((2, 0), np.float32)}, protocol="http")["OUTPUT0"]
    assert empty.shape == (2, 0)


def test_16_concurrent_clients_each_get_their_own_answer(server):
    before = server.statistics("c_scale")["model_stats"][0]
    errors: list[str] = []

    def client(cid: int) -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            for i in range(25):
                x = np.full((1, 16), cid * 1000 + i, np.float32) + np.arange(16, dtype=np.float32) / 16
                out = infer(server, "c_scale", {"INPUT0": x}, client=c)["OUTPUT0"]
                if not np.array_equal(out, x * 2):
                    errors.append(f"client {cid} request {i}: got {out[0, :3]} for {x[0, :3]}")

    threads = [threading.Thread(target=client, args=(cid,)) for cid in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:5]

    after = _stats_once_counted(server, "c_scale", "inference_count", int(before["inference_count"]) + 400)
    requests = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert requests == 400
    assert executions < requests  # several requests per Execute: the dynamic batcher did its job
    # Every request carried one item, so a batch of more than one was formed by the dynamic
    # batcher and reported by our ReportBatchStatistics.
    counts_before = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in before["batch_stats"]}
    grown = {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) - counts_before.get(int(b["batch_size"]), 0)
        for b in after["batch_stats"]
    }
    assert sum(size * n for size, n in grown.items()) == 400, grown
    assert any(size > 1 and n > 0 for size, n in grown.items()), grown
    success = after["inference_stats"]["success"]
    assert int(success["count"]) >= 400 and int(after["inference_stats"]["compute_infer"]["ns"]) > 0


def test_wrong_dtype_is_refused_and_the_server_keeps_serving(server):
    x = np.arange(8, dtype=np.int32).reshape(1, 8)
    with pytest.raises(InferenceServerException, match="FP32"):
        infer(server, "c_scale", {"INPUT0": x})
    fails_before = int(server.statistics("c_scale_fp64")["model_stats"][0]["inference_stats"]["fail"]["count"])
    # Past Triton's own check (the config says FP64) the backend itself answers with an error.
    with pytest.raises(InferenceServerException, match="scale: input 'INPUT0' must be FP32, got FP64"):
        infer(server, "c_scale_fp64", {"INPUT0": x.astype(np.float64)})
    stats = _stats_once_counted(server, "c_scale_fp64", "fail", fails_before + 1)["inference_stats"]
    assert int(stats["fail"]["count"]) == fails_before + 1
    assert server.is_ready()
    np.testing.assert_array_equal(infer(server, "c_scale", {"INPUT0": x.astype(np.float32)})["OUTPUT0"], x * 2.0)


def test_digits_preprocessing_matches_the_agreed_formula(server):
    from sklearn.datasets import load_digits

    images = load_digits().images[:64].astype(np.uint8)
    pixels = infer(server, "digits_preprocess_c", {"IMAGE": images})["PIXELS"]
    expected = images.reshape(-1, 64).astype(np.float32) / np.float32(8.0) - np.float32(1.0)
    assert pixels.dtype == np.float32 and pixels.shape == (64, 64)
    np.testing.assert_array_equal(pixels, expected)
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0


def test_a_bad_image_fails_alone_inside_a_batch(server):
    good = np.random.default_rng(1).integers(0, 17, (8, 1, 8, 8)).astype(np.uint8)
    results: dict[int, object] = {}

    def send(i: int) -> None:
        image = good[i].copy()
        if i % 4 == 3:
            image[0, 2, 5] = 200
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            try:
                results[i] = infer(server, "digits_preprocess_c", {"IMAGE": image}, client=c)["PIXELS"]
            except InferenceServerException as exc:
                results[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i in range(8):
        if i % 4 == 3:
            assert isinstance(results[i], InferenceServerException), results[i]
            assert "IMAGE values must be 0..16" in str(results[i]) and "got 200" in str(results[i])
            assert "pixel 21" in str(results[i])
        else:
            np.testing.assert_array_equal(results[i], good[i].reshape(1, 64).astype(np.float32) / 8 - 1)
    assert server.is_ready()


def test_server_memory_does_not_grow_over_10k_requests(server):
    """Leaking a request, a response or a gathered buffer costs >= 8 KiB per request here."""
    proc = psutil.Process(server.pid)
    length = 2048  # 8 KiB per request: a per-request leak would add ~80 MiB over 10k

    async def flood(count: int, concurrency: int = 32) -> int:
        import tritonclient.grpc.aio as aioclient

        client = aioclient.InferenceServerClient(server.grpc_url)
        wrong = 0

        async def worker(w: int) -> None:
            nonlocal wrong
            for i in range(w, count, concurrency):
                x = np.full((1, length), i % 997, np.float32)
                tensor = aioclient.InferInput("INPUT0", [1, length], "FP32")
                tensor.set_data_from_numpy(x)
                result = await client.infer("c_scale", [tensor])
                out = result.as_numpy("OUTPUT0")
                wrong += int(out[0, 0] != 2 * (i % 997) or out[0, -1] != 2 * (i % 997))

        try:
            await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(concurrency))), timeout=300)
        finally:
            await client.close()
        return wrong

    count_before = int(server.statistics("c_scale")["model_stats"][0]["inference_count"])
    assert asyncio.run(flood(2000)) == 0  # warm-up: allocator pools and gRPC buffers settle
    rss_before = proc.memory_info().rss
    started = time.monotonic()
    assert asyncio.run(flood(10_000)) == 0
    elapsed = time.monotonic() - started
    rss_after = proc.memory_info().rss
    count_after = int(
        _stats_once_counted(server, "c_scale", "inference_count", count_before + 12_000)["inference_count"]
    )
    growth_mib = (rss_after - rss_before) / 2**20
    print(f"10k requests in {elapsed:.1f} s ({10_000 / elapsed:.0f} req/s); server RSS "
          f"{rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB ({growth_mib:+.1f} MiB)")
    assert count_after - count_before == 12_000  # warm-up + measured: every request was executed
    assert growth_mib < 16, f"server RSS grew by {growth_mib:.1f} MiB over 10k requests"


def test_trace_shows_the_timestamps_the_backend_reports(backend_dir, tmp_path):
    trace_file = tmp_path / "trace.json"
    with TritonServer(models=["c_scale"], backend_dir=backend_dir, trace_file=trace_file) as srv:
        for rows in (1, 3):
            infer(srv, "c_scale", {"INPUT0": np.ones((rows, 4), np.float32)})
    records = json.loads(trace_file.read_text())
    # One fact per record, grouped by trace id (the file is not in time order).
    models = {r["id"]: r["model_name"] for r in records if "model_name" in r}
    stamps: dict[int, dict[str, int]] = {}
    for r in records:
        for t in r.get("timestamps", []):
            stamps.setdefault(r["id"], {})[t["name"]] = int(t["ns"])
    traced = [stamps[i] for i, model in models.items() if model == "c_scale"]
    assert len(traced) == 2
    order = ("QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
    for trace in traced:
        # COMPUTE_* are the exec/compute timestamps our Execute passed to ReportStatistics.
        assert all(name in trace for name in order), sorted(trace)
        assert [trace[name] for name in order] == sorted(trace[name] for name in order)


# ---------------------------------------------------------------------------------- the C pipeline
def test_c_preprocessing_inside_the_ensemble(backend_dir):
    needed = ["digits_onnx", "digits_postprocess", "digits_ensemble"]
    missing = [m for m in needed if not (MODEL_REPOSITORY / m / "config.pbtxt").exists()]
    if missing:
        pytest.skip(f"models {missing} are not in model_repository yet")
    if not list((MODEL_REPOSITORY / "digits_onnx" / "1").glob("*.onnx")):
        pytest.skip("digits_onnx has no trained model.onnx: run `lab-backends setup` first")
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images[:32].astype(np.uint8)
    models = ["digits_preprocess", "digits_preprocess_c", "digits_onnx", "digits_postprocess",
              "digits_ensemble", "digits_ensemble_c"]
    with TritonServer(models=models, backend_dir=backend_dir) as srv:
        c_out = infer(srv, "digits_ensemble_c", {"IMAGE": images})
        py_out = infer(srv, "digits_ensemble", {"IMAGE": images})
    np.testing.assert_array_equal(c_out["LABELS"], py_out["LABELS"])
    np.testing.assert_allclose(c_out["PROBS"], py_out["PROBS"], rtol=1e-6)
    top1 = np.array([int(label) for label in c_out["LABELS"][:, 0].astype(str)])
    assert (top1 == digits.target[:32]).mean() > 0.8
