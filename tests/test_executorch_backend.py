"""lab_executorch (C++, ExecuTorch's runtime; c_backends/frameworks/lab_executorch/) inside the real tritonserver.

Set-up's two ExecuTorch steps run first (stale-checked: a stat each when done): the build environment and
the ``digits_et`` program exported from ``digits_torch``'s weights
(:mod:`lab_backends.digits.executorch_env`), and the backend (:mod:`lab_backends.server.executorch_backend`).
ONE server for the module serves ``digits_et`` beside the Python-wrapped ``digits_torch`` and the
test-only variants of a temporary repository:

* ``digits_et`` answers every held-out digit as ``digits_torch`` does (same class, logits within 1e-4),
  also for concurrent requests of 1..8 rows gathered into shared executes (counts: fewer executes
  than requests, the rows per execute in batch_stats), and on ExecuTorch's shared pool too;
* a request whose shape or type contradicts the config fails alone, the requests sent with it answered:
  Triton's core refuses it before it is queued (core src/infer_request.cc at r24.10, L1097-L1157), so
  with the fixed dims lab_executorch accepts, the backend's own per-request checks are never reached;
* the statistics carry the backend's own timestamps;
* 16 load/unload cycles leave the server's RSS flat (under half of what a leak of the program would add);
* a config that contradicts the program's own metadata (an input's dims, a type, an output's dims, a
  max_batch_size past the exported bound), a missing program and a bad thread parameter each fail the
  load with one line naming the model, the tensor or file, and the fix.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits import build, executorch_env, load_split
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend, executorch_backend
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer
from tests.native_checks import concurrently, counted, held_out_pixels, model_stats, served_logits, unloaded

pytestmark = pytest.mark.server
MODEL = "digits_et"
REFERENCE = "digits_torch"
BAD_DIMS, BAD_DTYPE, BAD_OUTPUT, TOO_BIG, MISSING, BAD_THREADS = (
    "et_bad_dims", "et_fp64", "et_bad_output", "et_batch128", "et_missing", "et_bad_threads")
POOL = "et_shared_pool"
CYCLED = "et_cycle"
#: Load/unload cycles of the RSS test, and its bound: half of what the program's 17 MiB leaked at every
#: cycle would add from the 3rd unload to the last (the reasoning of test_native_frameworks' RSS test).
CYCLES = 16
RSS_BOUND_MIB = 0.5 * 17 * (CYCLES - 3)
ENTRY_POINTS = {"TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                "TRITONBACKEND_ModelInstanceInitialize", "TRITONBACKEND_ModelInstanceFinalize",
                "TRITONBACKEND_ModelInstanceExecute"}


def _variant(repo: Path, name: str, *, program: bool = True, input_dims: list[int] | None = None,
             dtype: str | None = None, output_dims: list[int] | None = None, max_batch: int | None = None,
             threads: str | None = None) -> None:
    """A copy of digits_et's config under another name, changed through the protobuf schema."""
    config = read_config(MODEL_REPOSITORY / MODEL)
    config.name = name
    if input_dims is not None:
        config.input[0].dims[:] = input_dims
    if dtype is not None:
        config.input[0].data_type = model_config_pb2.DataType.Value(dtype)
    if output_dims is not None:
        config.output[0].dims[:] = output_dims
    if max_batch is not None:
        config.max_batch_size = max_batch
    if threads is not None:
        config.parameters["XNNPACK_THREADS"].string_value = threads
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_text(config))
    if program:
        shutil.copy2(executorch_env.PLACED, folder / "1" / "model.pte")


@pytest.fixture(scope="module")
def library() -> Path:
    build.build_models()  # model.pt, which the program is exported from
    executorch_env.build_digits_et()
    return executorch_backend.build()


@pytest.fixture(scope="module")
def server(library, tmp_path_factory):
    repo = tmp_path_factory.mktemp("et_variants")
    _variant(repo, BAD_DIMS, input_dims=[63])
    _variant(repo, BAD_DTYPE, dtype="TYPE_FP64")
    _variant(repo, BAD_OUTPUT, output_dims=[9])
    _variant(repo, TOO_BIG, max_batch=128)
    _variant(repo, MISSING, program=False)
    _variant(repo, BAD_THREADS, threads="two")
    _variant(repo, POOL, threads="0")
    _variant(repo, CYCLED)
    models = [MODEL, REFERENCE, POOL, BAD_DIMS, BAD_DTYPE, BAD_OUTPUT, TOO_BIG, MISSING, BAD_THREADS]
    # Two malloc arenas, as test_native_frameworks' server: the RSS test then reads leaks, not arenas.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MALLOC_ARENA_MAX", "2")
        with TritonServer([MODEL_REPOSITORY, repo], models=models, allow_broken_models=True) as srv:
            yield srv


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return held_out_pixels()


@pytest.fixture(scope="module")
def reference(server, pixels) -> np.ndarray:
    """digits_torch's logits for every held-out digit, as served."""
    return served_logits(server, REFERENCE, pixels)


def test_builds_with_the_runtime_beside_it_and_exports_only_entry_points(library) -> None:
    assert library == cbackend.library_path(executorch_backend.NAME)
    assert set(cbackend.exported_symbols(library)) == ENTRY_POINTS
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "[$ORIGIN]" in dynamic  # the runtime's libraries are found beside the backend, not in the venv
    for name in executorch_backend.LIBRARIES:  # --no-as-needed kept the self-registering ones
        assert f"[{name}]" in dynamic and (library.parent / name).is_file(), name
    assert not executorch_backend.is_stale()
    assert executorch_backend.build().stat().st_mtime_ns == library.stat().st_mtime_ns  # not rebuilt


@pytest.mark.parametrize("model", [MODEL, POOL])
def test_agrees_with_digits_torch_on_every_held_out_digit(server, pixels, reference, model) -> None:
    got = np.concatenate([infer(server, model, {"PIXELS": pixels[i:i + 64]})["LOGITS"]
                          for i in range(0, len(pixels), 64)])
    assert got.shape == reference.shape == (360, 10) and got.dtype == np.float32
    assert (got.argmax(1) == reference.argmax(1)).all()
    assert np.abs(got - reference).max() < 1e-4
    assert (got.argmax(1) == load_split().test_labels).mean() > 0.9


def test_concurrent_requests_are_gathered_into_shared_executes_and_scattered_right(server, pixels,
                                                                                    reference) -> None:
    rng = np.random.default_rng(49)
    rows = [int(n) for n in rng.integers(1, 9, 24)]
    starts = [int(rng.integers(0, len(pixels) - n)) for n in rows]
    before = model_stats(server, MODEL)
    results = concurrently(server, MODEL, [pixels[s:s + n] for s, n in zip(starts, rows)])
    for got, start, n in zip(results, starts, rows):
        assert isinstance(got, np.ndarray) and got.shape == (n, 10), got
        assert np.abs(got - reference[start:start + n]).max() < 1e-4
    after = counted(server, MODEL, before, len(rows), sum(rows))
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert int(after["inference_count"]) - int(before["inference_count"]) == sum(rows)  # rows, not requests
    assert executions < len(rows), "no two requests shared an execute: the dynamic batcher did not batch"
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert max(sizes) > 8, sizes  # an execute held rows of several requests (each sent 1..8)


def test_a_request_triton_refuses_fails_alone_while_its_batch_mates_are_answered(server, pixels,
                                                                                 reference) -> None:
    requests = [pixels[8 * i:8 * i + 3] for i in range(6)]
    requests[2] = np.zeros((2, 63), np.float32)
    requests[4] = pixels[32:35].astype(np.float64)
    results = concurrently(server, MODEL, requests)
    for i, got in enumerate(results):
        if i in (2, 4):
            assert isinstance(got, InferenceServerException), got
            assert ("unexpected shape" in str(got)) if i == 2 else ("FP64" in str(got) and "FP32" in str(got))
        else:
            assert np.abs(got - reference[8 * i:8 * i + 3]).max() < 1e-4
    assert server.is_ready()


def test_statistics_carry_the_backends_timestamps(server, pixels) -> None:
    before = model_stats(server, MODEL)
    for n in (1, 5, 8):
        infer(server, MODEL, {"PIXELS": pixels[:n]})
    stats = counted(server, MODEL, before, 3, 14)
    inference = stats["inference_stats"]
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert int(inference[part]["count"]) > 0 and int(inference[part]["ns"]) > 0, part
    assert 0 < int(inference["compute_infer"]["ns"]) / int(inference["compute_infer"]["count"]) < 5e9
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(batches.values()) == int(stats["execution_count"]) and {1, 5, 8} <= set(batches)


@pytest.mark.parametrize("model, names, fix", [
    (BAD_DIMS, ["input 'PIXELS' has dims [63]", "et_bad_dims/1/model.pte has [64, 64]"],
     "set dims to the sizes after the batch"),
    (BAD_DTYPE, ["input 'PIXELS' is TYPE_FP64", "computes Float"], "set data_type: TYPE_FP32 for 'PIXELS'"),
    (BAD_OUTPUT, ["output 'LOGITS' has dims [9]", "has [64, 10]"], "set dims to the sizes after the batch"),
    (TOO_BIG, ["max_batch_size is 128", "exported for at most 64 rows"], "set max_batch_size: 64 or less"),
    (MISSING, ["cannot open", "et_missing/1/model.pte"], "lab-backends setup"),
    (BAD_THREADS, ["parameter XNNPACK_THREADS is 'two'"], 'use "1"'),
])
def test_a_config_the_program_contradicts_fails_the_load_with_one_line(server, model, names, fix) -> None:
    reason = server.broken_models[model]
    assert "\n" not in reason, reason
    line = reason[reason.index("lab_executorch: "):]
    assert line.startswith(f"lab_executorch: model '{model}': "), reason
    for part in (*names, f"{model}/config.pbtxt" if model != MISSING else "config.pbtxt", fix):
        assert part in line, (part, reason)
    assert server.model_ready(MODEL) and server.model_ready(POOL)  # the others loaded and serve


def test_load_unload_cycles_leave_the_server_rss_flat(server, pixels) -> None:
    """Each load opens the program, plans its memory and loads the method (the XNNPACK delegate packs its
    weights); each unload must free all of it. A leak of the program (17 MiB) grows RSS at every cycle;
    the lowest RSS of the last three unloads is read against the 3rd."""
    process = psutil.Process(server.pid)
    rss = []
    for _ in range(CYCLES):
        server.load_model(CYCLED)
        for n in range(1, 9):
            infer(server, CYCLED, {"PIXELS": pixels[:n]})
        server.unload_model(CYCLED)
        unloaded(server, CYCLED)
        rss.append(process.memory_info().rss / 2**20)
    growth = min(rss[-3:]) - rss[2]
    print(f"RSS after each unload (MiB): {[round(r, 1) for r in rss]}; growth {growth:+.1f} MiB")
    assert growth < RSS_BOUND_MIB, rss


def test_xnnpack_threads_one_starts_no_pool_and_zero_starts_executorchs(library, tmp_path, pixels) -> None:
    """XNNPACK_THREADS "1": the delegate runs on the instance's own thread (NoThreadPoolGuard while the method
    loads, when XNNPACK creates its runtime, and while it executes), so a second such model adds only what
    Triton adds for any model; "0": ExecuTorch's process-wide pool starts with the first model that asks for
    it, sized to the cores with the calling thread one of them (measured here, 3 runs: both "1" models added
    2 threads, the "0" model 3). On a server of its own (the module's server already started the pool)."""
    for name, threads in (("et_warm", "1"), ("et_own", "1"), ("et_pool", "0")):
        _variant(tmp_path, name, threads=threads)
    with TritonServer(tmp_path, models=[], target="local") as own:
        process = psutil.Process(own.pid)
        added = {}
        for name in ("et_warm", "et_own", "et_pool"):  # the first absorbs what a server's first load starts
            before = process.num_threads()
            own.load_model(name)
            infer(own, name, {"PIXELS": pixels[:64]})
            added[name] = process.num_threads() - before
    assert added["et_pool"] > added["et_own"], added
