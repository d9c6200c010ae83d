"""lab_tensorflow (C, TensorFlow's C API) and lab_libtorch (C++, libtorch), in c_backends/frameworks/,
inside the real tritonserver.

The backends are built by :mod:`lab_backends.server.native_backends` (stale-checked, into build/backends
as set-up does) and served by ONE server for the module, beside the Python-wrapped ``digits_torch``:

* ``digits_tf_native`` and ``digits_torch_native`` answer every held-out digit as ``digits_torch`` does
  (same class, logits within 1e-4), also for concurrent requests of 1..8 rows each, gathered into
  shared batches;
* a request the model cannot take fails alone: on ``digits_tf_native`` Triton refuses a wrong shape or
  dtype before the batcher; on ``tf_native_ragged`` (open dims, ``allow_ragged_batch``) a row of the
  wrong length reaches the backend inside a batch, which answers it with its own error and serves its
  batch-mates;
* the statistics carry the backend's own timestamps, and the thread parameters reach TensorFlow (two
  sessions with inter-op pools of their own, of 1 and 6 threads, differ by 5 server threads);
* a missing SavedModel / TorchScript file, a wrong signature name, a wrong dtype in the config and a
  bad thread count fail the load with one line naming the model, the file and the fix;
* a failed ModelInitialize / ModelInstanceInitialize still gets its ModelFinalize /
  ModelInstanceFinalize (core backend_model.cc L169-176 and L983-987, backend_model_instance.cc
  L305-311 and L209-214 at r24.10), with no state set: the backends log it, nothing is freed twice
  (the server runs on, its log free of allocator errors), and the same model loads once its file is there;
* a libtorch exception fails its batch with PyTorch's words and the server serves on; the same
  exception let out of the backend (``LAB_TEST_UNGUARDED_FORWARD``) kills the server, and
  ``lab-backends serve`` reports it like any other crash (tests/reliability/test_long_name_crash.py);
* 20 load/unload cycles of each native model leave the server's RSS flat (under half a leak's growth).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits import build, load_split
from lab_backends.errors import BackendBuildError
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend, native_backends
from lab_backends.server.processes import terminate
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll
from tests.native_checks import concurrently, counted, counts, held_out_pixels, model_stats, served_logits, unloaded

pytestmark = pytest.mark.server
NATIVE = "digits_tf_native"
REFERENCE = "digits_torch"
#: Test-only variants of digits_tf_native, served from a temporary repository.
MISSING, BAD_SIGNATURE, BAD_DTYPE, RAGGED = ("tf_native_missing", "tf_native_bad_signature",
                                             "tf_native_fp64", "tf_native_ragged")
TORCH_NATIVE = "digits_torch_native"
NATIVES = (NATIVE, TORCH_NATIVE)
#: Test-only variants of digits_torch_native.
PT_MISSING, PT_BAD_DTYPE, PT_BAD_THREADS, PT_RAGGED, PT_UNGUARDED = (
    "torch_native_missing", "torch_native_fp64", "torch_native_bad_threads", "torch_native_ragged",
    "torch_native_unguarded")
PT_THREADS2 = "torch_native_threads2"  # loaded by the thread test
#: Copies loaded and unloaded 10 times by the RSS test (not loaded at start).
CYCLED = {NATIVE: "tf_native_cycle", TORCH_NATIVE: "torch_native_cycle"}
ROOT = Path(__file__).resolve().parents[1]
#: Load/unload cycles of the RSS test, and the growth that counts as a leak: half of what the model's
#: weights (17 MiB) leaked at every cycle would add from the 3rd unload to the last (see the test).
CYCLES = 20
RSS_BOUND_MIB = 0.5 * 17 * (CYCLES - 3)
ENTRY_POINTS = {"TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                "TRITONBACKEND_ModelInstanceInitialize", "TRITONBACKEND_ModelInstanceFinalize",
                "TRITONBACKEND_ModelInstanceExecute"}


def _variant(repo: Path, name: str, *, savedmodel: bool = True, signature: str | None = None,
             dtype: str | None = None, ragged: bool = False, inter_threads: str | None = None) -> None:
    """A copy of digits_tf_native's config under another name, changed through the protobuf schema."""
    config = read_config(MODEL_REPOSITORY / NATIVE)
    config.name = name
    if inter_threads is not None:  # a pool of its own: TensorFlow's default pools are per process
        config.parameters["TF_NUM_INTER_THREADS"].string_value = inter_threads
        config.parameters["TF_USE_PER_SESSION_THREADS"].string_value = "1"
    if signature is not None:
        config.parameters["TF_SIGNATURE_DEF"].string_value = signature
    if dtype is not None:
        config.input[0].data_type = model_config_pb2.DataType.Value(dtype)
    if ragged:  # rows of any length reach the backend, in shared batches (core backend_model.cc:802-818)
        config.input[0].dims[:] = [-1]
        config.input[0].allow_ragged_batch = True
        config.dynamic_batching.max_queue_delay_microseconds = 300_000
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_text(config))
    if savedmodel:
        shutil.copytree(build.ARTIFACT_DIR / "model.savedmodel", folder / "1" / "model.savedmodel")


def _torch_variant(repo: Path, name: str, *, model_file: bool = True, dtype: str | None = None,
                   threads: str | None = None, ragged: bool = False, unguarded: bool = False) -> None:
    """A copy of digits_torch_native's config under another name, changed through the protobuf schema."""
    config = read_config(MODEL_REPOSITORY / TORCH_NATIVE)
    config.name = name
    if dtype is not None:
        config.input[0].data_type = model_config_pb2.DataType.Value(dtype)
    if threads is not None:
        config.parameters["INTRA_OP_THREAD_COUNT"].string_value = threads
    if ragged:  # rows of any length reach the backend, in shared batches: libtorch's own check is the last one
        config.input[0].dims[:] = [-1]
        config.input[0].allow_ragged_batch = True
        config.dynamic_batching.max_queue_delay_microseconds = 300_000
    if unguarded:  # the test switch: forward runs without its try/catch
        config.parameters["LAB_TEST_UNGUARDED_FORWARD"].string_value = "1"
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_text(config))
    if model_file:
        shutil.copy2(build.ARTIFACT_DIR / "model.pt", folder / "1" / "model.pt")


@pytest.fixture(scope="module")
def library() -> Path:
    build.build_models()  # the SavedModel and the TorchScript file, placed in digits_*_native/1/
    return native_backends.build_tensorflow()


@pytest.fixture(scope="module")
def torch_library(library) -> Path:  # after build_models: the TorchScript file the variants copy
    return native_backends.build_libtorch()


@pytest.fixture(scope="module")
def variants(library, torch_library, tmp_path_factory) -> Path:
    """The temporary repository of the test-only variants (the server's second repository)."""
    repo = tmp_path_factory.mktemp("tf_native")
    _variant(repo, MISSING, savedmodel=False)
    _variant(repo, BAD_SIGNATURE, signature="serving_defualt")
    _variant(repo, BAD_DTYPE, dtype="TYPE_FP64")
    _variant(repo, RAGGED, ragged=True)
    for threads in ("1", "6"):  # loaded by the test that counts their threads
        _variant(repo, f"tf_native_inter{threads}", inter_threads=threads)
    _variant(repo, CYCLED[NATIVE])
    _torch_variant(repo, PT_MISSING, model_file=False)
    _torch_variant(repo, PT_BAD_DTYPE, dtype="TYPE_FP64")
    _torch_variant(repo, PT_BAD_THREADS, threads="two")
    _torch_variant(repo, PT_RAGGED, ragged=True)
    _torch_variant(repo, CYCLED[TORCH_NATIVE])
    _torch_variant(repo, PT_THREADS2, threads="2")
    return repo


@pytest.fixture(scope="module")
def server(variants):
    repo = variants
    models = [NATIVE, TORCH_NATIVE, REFERENCE, MISSING, BAD_SIGNATURE, BAD_DTYPE, RAGGED,
              PT_MISSING, PT_BAD_DTYPE, PT_BAD_THREADS, PT_RAGGED]
    # Two malloc arenas: freed weights are then reused by the next load, whichever thread allocates, so
    # the RSS test below reads leaks, not how many of glibc's (up to 8 per core) arenas a load touched.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MALLOC_ARENA_MAX", "2")  # read by the server at its start (its environment is ours)
        with TritonServer([MODEL_REPOSITORY, repo], models=models, allow_broken_models=True) as srv:
            yield srv


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return held_out_pixels()


@pytest.fixture(scope="module")
def reference(server, pixels) -> np.ndarray:
    """digits_torch's logits for every held-out digit, as served."""
    return served_logits(server, REFERENCE, pixels)


def _settled(server, model: str, timeout_s: float = 10.0) -> dict:
    """The statistics once two reads 100 ms apart agree: the snapshot *before* a test's requests (an
    earlier test's last batch may still be reporting). After them, :func:`native_checks.counted` waits for the
    known total instead."""
    deadline = time.monotonic() + timeout_s
    last = model_stats(server, model)
    while True:
        time.sleep(0.1)
        now = model_stats(server, model)
        if counts(now) == counts(last) or time.monotonic() > deadline:
            return now
        last = now


# ---------------------------------------------------------------------------------- build
def test_builds_against_the_wheels_tensorflow_and_exports_only_entry_points(library) -> None:
    assert library == cbackend.library_path(native_backends.TENSORFLOW_BACKEND)
    assert set(cbackend.exported_symbols(library)) == ENTRY_POINTS  # helpers stay hidden
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    runtime = native_backends.tensorflow_runtime()
    assert "libtensorflow_cc.so.2" in dynamic and str(runtime.root) in dynamic  # found without LD_LIBRARY_PATH
    assert not native_backends.tensorflow_is_stale()
    assert native_backends.build_tensorflow().stat().st_mtime_ns == library.stat().st_mtime_ns  # not rebuilt


def test_gold_links_a_framework_and_refuses_a_misspelled_tf_function_as_bfd_does(tmp_path, monkeypatch) -> None:
    """Framework backends link with gold when binutils has it (faster on libtensorflow_cc); ``-z defs`` must
    stay as strict with it, and without it (the branch a machine without ld.gold takes) gcc's default links."""
    source = tmp_path / "typo.c"
    source.write_text('#include "tensorflow/c/c_api.h"\n#include "lab_triton.h"\n'
                      "void TF_DeleteTensorr(TF_Tensor*);  /* declared, so that only the link can catch it */\n"
                      "TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* i,\n"
                      "    TRITONBACKEND_Request** r, const uint32_t n) {\n"
                      "  (void)i; (void)r; (void)n; TF_DeleteTensorr(NULL); return NULL; }\n")
    runtime = native_backends.tensorflow_runtime()
    include = (cbackend.INCLUDE_DIR, runtime.include_dir)
    which = shutil.which
    for linker in (("-fuse-ld=gold",), ()):
        monkeypatch.setattr(shutil, "which", lambda name, gold=bool(linker): which(name) if name != "ld.gold" or gold
                            else None)
        assert native_backends.faster_linker() == linker
        with pytest.raises(BackendBuildError, match="undefined reference.*TF_DeleteTensorr"):
            cbackend.build(source, "typo", tmp_path / str(bool(linker)), include_dirs=include,
                           link_flags=runtime.link_flags(), required=("TRITONBACKEND_ModelInstanceExecute",))


def test_libtorch_builds_with_gxx_against_the_wheels_libtorch(torch_library) -> None:
    assert torch_library == cbackend.library_path(native_backends.LIBTORCH_BACKEND)
    assert set(cbackend.exported_symbols(torch_library)) == ENTRY_POINTS  # extern "C", the rest hidden
    dynamic = subprocess.run(["readelf", "-d", str(torch_library)], capture_output=True, text=True,
                             check=True).stdout
    runtime = native_backends.libtorch_runtime()
    assert "libtorch_cpu.so" in dynamic and "libc10.so" in dynamic and str(runtime.root / "lib") in dynamic
    assert not native_backends.libtorch_is_stale()
    assert native_backends.build_libtorch().stat().st_mtime_ns == torch_library.stat().st_mtime_ns  # not rebuilt


# ---------------------------------------------------------------------------------- answers
@pytest.mark.parametrize("model", NATIVES)
def test_agrees_with_digits_torch_on_every_held_out_digit(server, pixels, reference, model) -> None:
    native = np.concatenate([infer(server, model, {"PIXELS": pixels[i:i + 64]})["LOGITS"]
                             for i in range(0, len(pixels), 64)])
    assert native.shape == reference.shape == (360, 10) and native.dtype == np.float32
    assert (native.argmax(1) == reference.argmax(1)).all()
    assert np.abs(native - reference).max() < 1e-4
    assert (native.argmax(1) == load_split().test_labels).mean() > 0.9


@pytest.mark.parametrize("model", NATIVES)
def test_concurrent_requests_of_1_to_8_rows_are_gathered_and_scattered_right(server, pixels, reference,
                                                                              model) -> None:
    rng = np.random.default_rng(35)
    rows = [int(n) for n in rng.integers(1, 9, 24)]
    starts = [int(rng.integers(0, len(pixels) - n)) for n in rows]
    before = _settled(server, model)
    results = concurrently(server, model, [pixels[s:s + n] for s, n in zip(starts, rows)])
    for got, start, n in zip(results, starts, rows):
        assert isinstance(got, np.ndarray) and got.shape == (n, 10), got
        assert np.abs(got - reference[start:start + n]).max() < 1e-4
    after = counted(server, model, before, len(rows), sum(rows))
    requests = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert requests == len(rows)
    assert int(after["inference_count"]) - int(before["inference_count"]) == sum(rows)  # rows, not requests
    assert executions < requests, "no two requests shared a framework run: the dynamic batcher did not batch"


def test_a_wrong_shape_or_dtype_fails_alone_while_concurrent_requests_are_answered(server, pixels, reference) -> None:
    """On digits_tf_native Triton refuses them against the config, before the batcher."""
    requests = [pixels[8 * i:8 * i + 3] for i in range(6)]
    requests[2] = np.zeros((2, 63), np.float32)
    requests[4] = pixels[32:35].astype(np.float64)
    results = concurrently(server, NATIVE, requests)
    for i, got in enumerate(results):
        if i in (2, 4):
            assert isinstance(got, InferenceServerException), got
            assert ("unexpected shape" in str(got)) if i == 2 else ("FP64" in str(got) and "FP32" in str(got))
        else:
            assert np.abs(got - reference[8 * i:8 * i + 3]).max() < 1e-4


def test_a_row_the_model_cannot_take_fails_alone_inside_its_batch(server, pixels, reference) -> None:
    """tf_native_ragged lets a 63-value row through Triton and into a shared batch: the backend's check
    answers it with its own error, and the rows gathered around it are computed and scattered."""
    requests = [pixels[10 * i:10 * i + 1 + i % 4] for i in range(8)]
    requests[5] = np.zeros((2, 63), np.float32)
    before = _settled(server, RAGGED)
    results = concurrently(server, RAGGED, requests)
    for i, got in enumerate(results):
        if i == 5:
            assert isinstance(got, InferenceServerException), got
            assert "lab_tensorflow: input 'PIXELS' has shape [2, 63], but the model takes rows of [64]" in str(got)
        else:
            assert np.abs(got - reference[10 * i:10 * i + 1 + i % 4]).max() < 1e-4
    after = counted(server, RAGGED, before, len(requests), sum(len(r) for i, r in enumerate(requests) if i != 5))
    assert int(after["inference_stats"]["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"]) == 1
    assert int(after["execution_count"]) - int(before["execution_count"]) < len(requests)  # shared batches
    assert server.is_ready()


@pytest.mark.parametrize("model", NATIVES)
def test_statistics_carry_the_backends_timestamps(server, pixels, model) -> None:
    before = _settled(server, model)
    for n in (1, 5, 8):
        infer(server, model, {"PIXELS": pixels[:n]})
    stats = counted(server, model, before, 3, 14)
    inference = stats["inference_stats"]
    executions = int(stats["execution_count"])
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert int(inference[part]["count"]) > 0 and int(inference[part]["ns"]) > 0, part
    # The framework's run of a 3x2048^2 MLP costs more than the gather and the scatter around it.
    assert int(inference["compute_infer"]["ns"]) > int(inference["compute_input"]["ns"])
    assert 0 < int(inference["compute_infer"]["ns"]) / int(inference["compute_infer"]["count"]) < 5e9
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(batches.values()) == executions and {1, 5, 8} <= set(batches)  # rows per batch, ours


def test_thread_parameters_reach_tensorflow(server, pixels) -> None:
    """Two sessions with their own inter-op pools, of 1 and of 6 threads: the second adds 5 more.

    Without TF_USE_PER_SESSION_THREADS the first session's pools serve every later one (measured: a
    second model with 6 inter-op threads then added 2 threads, not 8)."""
    process = psutil.Process(server.pid)
    added = {}
    for threads in ("1", "6"):  # both stay loaded until both are counted: a pool that ends takes a while
        name = f"tf_native_inter{threads}"
        before = process.num_threads()
        server.load_model(name)
        infer(server, name, {"PIXELS": pixels[:2]})
        added[threads] = process.num_threads() - before
    for threads in ("1", "6"):
        server.unload_model(f"tf_native_inter{threads}")
        unloaded(server, f"tf_native_inter{threads}")  # their threads end before the next test counts its own
    assert 4 <= added["6"] - added["1"] <= 7, added


def test_intra_op_thread_count_reaches_libtorch(server, pixels, reference) -> None:
    """INTRA_OP_THREAD_COUNT 2 (the server's environment says OMP_NUM_THREADS=1): the instance reports 2
    intra-op threads once loaded, the batch of 64 rows runs on an OpenMP team of 2 (one more thread in
    the server), and the answers do not change."""
    name = PT_THREADS2
    process = psutil.Process(server.pid)
    _no_load_in_flight(server)  # an unload still finishing elsewhere would take its threads out of the count
    before = process.num_threads()
    server.load_model(name)
    try:
        got = infer(server, name, {"PIXELS": pixels[:64]})["LOGITS"]
        added = process.num_threads() - before
    finally:
        server.unload_model(name)
    assert np.abs(got - reference[:64]).max() < 1e-4
    assert f"lab_libtorch: instance '{name}_0_0': module loaded and probed in " in server.log_text()
    line = [ln for ln in server.log_text().splitlines() if f"instance '{name}_0_0': module loaded" in ln][-1]
    assert line.rstrip("\"").endswith("2 intra-op thread(s)"), line
    assert added >= 1, added


# ---------------------------------------------------------------------------------- load errors
@pytest.mark.parametrize("model, names, fix", [
    (MISSING, ["no SavedModel at", "tf_native_missing/1/model.savedmodel"], "lab-backends build-models"),
    (BAD_SIGNATURE, ["has no signature 'serving_defualt'", "(its signatures: serving_default)",
                     "tf_native_bad_signature/1/model.savedmodel"], 'key: "TF_SIGNATURE_DEF"'),
    (BAD_DTYPE, ["input 'PIXELS' is TYPE_FP64", "but DT_FLOAT in signature 'serving_default'",
                 "tf_native_fp64/1/model.savedmodel"], "set data_type: TYPE_FP32 for 'PIXELS'"),
    (PT_MISSING, ["no TorchScript file at", "torch_native_missing/1/model.pt"], "lab-backends build-models"),
    # TorchScript carries no signature: a one-row probe at load finds what the weights take.
    (PT_BAD_DTYPE, ["input 'PIXELS' is TYPE_FP64 [64]", "torch_native_fp64/1/model.pt cannot take one such row",
                    "Double", "Float"], "set data_type: TYPE_FP32 for 'PIXELS'"),
    (PT_BAD_THREADS, ["parameter INTRA_OP_THREAD_COUNT must be a whole number", "got 'two'"],
     'parameters { key: "INTRA_OP_THREAD_COUNT"'),
])
def test_a_broken_model_fails_its_load_with_one_line(server, model, names, fix) -> None:
    backend = "lab_libtorch" if model.startswith("torch_") else "lab_tensorflow"
    reason = server.broken_models[model]
    assert "\n" not in reason, reason
    line = reason[reason.index(f"{backend}: "):]
    assert line.startswith(f"{backend}: model '{model}': "), reason
    for part in (*names, f"{model}/config.pbtxt", fix):
        assert part in line, (part, reason)
    assert server.model_ready(NATIVE) and server.model_ready(TORCH_NATIVE)  # the others loaded and serve


#: The failed loads of the fixture, and where each failed: (model, the entry point that failed).
FAILED_LOADS = [(MISSING, "ModelInitialize"), (PT_MISSING, "ModelInitialize"), (PT_BAD_THREADS, "ModelInitialize"),
                (BAD_SIGNATURE, "ModelInstanceInitialize"), (BAD_DTYPE, "ModelInstanceInitialize"),
                (PT_BAD_DTYPE, "ModelInstanceInitialize")]


def test_a_failed_initialize_is_finalized_with_no_state_and_the_model_loads_once_fixed(server, variants, pixels,
                                                                                        reference) -> None:
    """Triton finalizes what failed to initialize: the backends set their state only once all went well,
    so each finalize finds none (logged), and nothing is freed twice. Costs one TensorFlow load (~2 s)."""
    log = server.log_text()
    for model, failed in FAILED_LOADS:
        backend = "lab_libtorch" if model.startswith("torch_") else "lab_tensorflow"
        model_line = f"{backend}: model '{model}': ModelFinalize with no state: its ModelInitialize failed"
        instance_line = (f"{backend}: instance '{model}_0_0': ModelInstanceFinalize with no state: "
                         "its ModelInstanceInitialize failed")
        if failed == "ModelInitialize":  # no instance was made; the model's finalize ran, with no state
            assert model_line in log and instance_line not in log, model
        else:  # the instance's finalize found no state; the model's found (and freed) the model's state
            assert instance_line in log and model_line not in log, model
    assert "double free" not in log and "free(): invalid" not in log
    assert server.is_running() and server.model_ready(NATIVE)
    shutil.copytree(build.ARTIFACT_DIR / "model.savedmodel", variants / MISSING / "1" / "model.savedmodel")
    server.load_model(MISSING)  # the same name, after a failed load: a fresh model, nothing left of the failure
    try:
        got = infer(server, MISSING, {"PIXELS": pixels[:8]})["LOGITS"]
    finally:
        server.unload_model(MISSING)
    assert np.abs(got - reference[:8]).max() < 1e-4


# ---------------------------------------------------------------------------------- framework errors
def test_a_libtorch_exception_fails_its_batch_and_the_server_serves_on(server, pixels, reference) -> None:
    """torch_native_ragged lets a 63-value row through Triton (dims [-1]) into module.forward, which throws;
    the backend catches it, answers with PyTorch's own words, and the next request is served."""
    with pytest.raises(InferenceServerException) as caught:
        infer(server, PT_RAGGED, {"PIXELS": np.zeros((2, 63), np.float32)})
    message = str(caught.value)
    assert f"lab_libtorch: model '{PT_RAGGED}': PyTorch failed the batch: " in message, message
    assert "mat1 and mat2 shapes cannot be multiplied (2x63 and 64x2048)" in message, message
    assert server.is_ready()
    assert np.abs(infer(server, PT_RAGGED, {"PIXELS": pixels[:3]})["LOGITS"] - reference[:3]).max() < 1e-4


def test_a_row_of_another_width_fails_alone_inside_a_libtorch_batch(server, pixels, reference) -> None:
    """A TorchScript file names no input shape, so with dims [-1] a batch can hold rows of 64 and of 63
    values: the backend runs one tensor per row shape, and only the request of the shape that libtorch
    refuses fails, in PyTorch's words, whichever request opened the batch."""
    requests = [pixels[10 * i:10 * i + 1 + i % 4] for i in range(8)]
    requests[5] = np.zeros((2, 63), np.float32)
    before = _settled(server, PT_RAGGED)
    results = concurrently(server, PT_RAGGED, requests)
    for i, got in enumerate(results):
        if i == 5:
            assert isinstance(got, InferenceServerException), got
            assert "PyTorch failed the batch: " in str(got) and "(2x63 and 64x2048)" in str(got), got
        else:
            assert isinstance(got, np.ndarray), got
            assert np.abs(got - reference[10 * i:10 * i + 1 + i % 4]).max() < 1e-4
    after = counted(server, PT_RAGGED, before, len(requests), sum(len(r) for i, r in enumerate(requests) if i != 5))
    assert int(after["inference_stats"]["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"]) == 1
    assert int(after["execution_count"]) - int(before["execution_count"]) < len(requests)  # shared batches
    assert server.is_ready()


# ---------------------------------------------------------------------------------- memory
def _no_load_in_flight(server, timeout_s: float = 60.0) -> None:
    """No model of the server is still loading or unloading."""
    poll(lambda: {m.get("state", "") for m in server.repository_index()}, lambda s: not s & {"LOADING", "UNLOADING"},
         timeout_s, 0.05)


@pytest.mark.parametrize("model", NATIVES)
def test_load_unload_cycles_leave_the_server_rss_flat(server, pixels, model) -> None:
    """20 cycles of load, 8 requests, unload; RSS read after each unload. A leak of the model's weights
    (about 17 MiB) grows RSS by that much at *every* cycle: about 290 MiB from the 3rd unload to the
    last. glibc's arenas also step by about a model's size now and then, up and down (measured under a
    one-core hog with the default arenas: four steps up, then two down, in ten cycles), and with two
    arenas (the fixture) they hold a copy or two at most. So the test reads the lowest RSS of the last
    three unloads against the 3rd: under half of what a leak would add."""
    name = CYCLED[model]
    process = psutil.Process(server.pid)
    rss = []
    for _ in range(CYCLES):
        server.load_model(name)
        for n in range(1, 9):
            infer(server, name, {"PIXELS": pixels[:n]})
        server.unload_model(name)
        unloaded(server, name)
        rss.append(process.memory_info().rss / 2**20)
    growth = min(rss[-3:]) - rss[2]
    print(f"{model}: RSS after each unload (MiB): {[round(r, 1) for r in rss]}; from the 3rd to the lowest of "
          f"the last three: {growth:+.1f} MiB")
    assert growth < RSS_BOUND_MIB, rss


# ---------------------------------------------------------------------------------- a crash
def test_serve_reports_an_exception_let_out_of_libtorch_like_any_crash(tmp_path, torch_library) -> None:
    """LAB_TEST_UNGUARDED_FORWARD runs forward in a noexcept frame, as a backend without its try/catch:
    the exception that the guarded backend answers (above) calls std::terminate, the server aborts, and
    ``lab-backends serve`` says so in the log's words, as for Triton's own crashes."""
    repo = tmp_path / "models"
    _torch_variant(repo, PT_UNGUARDED, ragged=True, unguarded=True)
    key_file, out, err = tmp_path / "admin.key", tmp_path / "serve.out", tmp_path / "serve.err"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_ADMIN_KEY", "TRITON_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab_backends.cli", "serve", "--model-repository", str(repo), "--model", PT_UNGUARDED,
         "--admin-key-file", str(key_file)],
        cwd=ROOT, stdout=open(out, "w"), stderr=open(err, "w"), env=env,
    )
    try:
        text = poll(out.read_text, lambda t: "Ctrl-C stops" in t or proc.poll() is not None, 120, 0.2)
        assert "Ctrl-C stops" in text, f"serve did not start:\n{text}\n{err.read_text()}"
        url = text.split("HTTP/REST : http://")[1].split()[0]
        client = httpclient.InferenceServerClient(url, network_timeout=30)
        row = httpclient.InferRequestedOutput("LOGITS")
        pixels = httpclient.InferInput("PIXELS", [1, 64], "FP32")
        pixels.set_data_from_numpy(np.zeros((1, 64), np.float32))
        client.infer(PT_UNGUARDED, [pixels], outputs=[row])  # a good row: served
        bad = httpclient.InferInput("PIXELS", [1, 63], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 63), np.float32))
        try:
            client.infer(PT_UNGUARDED, [bad], outputs=[row])
        except Exception:  # noqa: BLE001 - the connection dies with the server
            pass
        code = poll(proc.poll, lambda c: c is not None, 30, 0.2)
        report = err.read_text()
        assert code == 1, f"serve still runs (exit {code}) after the framework's exception:\n{report}"
        said = report.split("\nlast log lines:")[0]
        # TorchScript's interpreter rethrows an op's error as std::runtime_error ("The following operation
        # failed in the TorchScript interpreter. ..."): the report quotes libstdc++'s last words about it.
        assert "SIGABRT" in said and "terminate called after throwing an instance of" in said, report
        assert "what():" in said and "TorchScript interpreter" in said, report
        assert "mat1 and mat2 shapes cannot be multiplied" in report, report
        assert "lab-backends serve --restart" in said, report
    finally:
        terminate(proc)
