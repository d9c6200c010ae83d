"""The digits pipeline served by a real tritonserver: correct, batched, isolated, robust.

One server for the module loads the six models of the pipeline plus a test-only model that
raises. Answers are compared with PyTorch / ONNX Runtime run directly in this process on the
whole held-out set.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits import build_models, normalize
from lab_backends.digits.reference import onnx_logits, top_k, torch_logits
from lab_backends.measure.stats import entry_when
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

PIPELINE = ["digits_preprocess", "digits_torch", "digits_onnx", "digits_postprocess", "digits_ensemble", "digits_bls"]
CLIENTS = 16
REQUESTS_PER_CLIENT = 12

RAISER = textwrap.dedent(
    '''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            x = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
            if any((v < 0).any() for v in x):
                raise ValueError("raiser: negative input is a deliberate bug in model.py")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", v)]) for v in x]
    '''
)
RAISER_CONFIG = """
name: "raiser"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def expected(split):
    """Direct (in-process) answers on the whole held-out set."""
    build_models()
    pixels = normalize(split.test_images)
    logits = {"onnx": onnx_logits(pixels), "torch": torch_logits(pixels)}
    return {"pixels": pixels, "logits": logits, "top3": {fw: top_k(v, 3) for fw, v in logits.items()}}


@pytest.fixture(scope="module")
def server(tmp_path_factory, expected):
    extra = tmp_path_factory.mktemp("repo")
    (extra / "raiser" / "1").mkdir(parents=True)
    (extra / "raiser" / "1" / "model.py").write_text(RAISER)
    (extra / "raiser" / "config.pbtxt").write_text(RAISER_CONFIG)
    # Tracing is off for every model until a test turns it on for one (the file is startup-only).
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    with TritonServer(
        [MODEL_REPOSITORY, extra], models=PIPELINE + ["raiser"], startup_timeout_s=300,
        trace_file=trace_file, trace_level=("OFF",), trace_log_frequency=1,
    ) as srv:
        yield srv


# ---------------------------------------------------------------- correctness on the held-out set
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_preprocess_normalizes_exactly(server, split, expected, protocol):
    out = infer(server, "digits_preprocess", {"IMAGE": split.test_images[:64]}, protocol=protocol)["PIXELS"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected["pixels"][:64])


@pytest.mark.parametrize("framework", ["torch", "onnx"])
def test_framework_models_match_direct_run(server, split, expected, framework):
    pixels = expected["pixels"]
    served = np.concatenate([
        infer(server, f"digits_{framework}", {"PIXELS": pixels[i : i + 64]})["LOGITS"]
        for i in range(0, len(pixels), 64)
    ])
    np.testing.assert_allclose(served, expected["logits"][framework], rtol=0, atol=1e-5)
    assert (served.argmax(1) == split.test_labels).mean() >= 0.95


def test_postprocess_top3(server, expected):
    logits = expected["logits"]["onnx"][:50]
    out = infer(server, "digits_postprocess", {"LOGITS": logits})
    labels, probs = top_k(logits, 3)
    assert out["LABELS"].shape == (50, 3) and out["PROBS"].dtype == np.float32
    assert (out["LABELS"] == labels).all()
    np.testing.assert_allclose(out["PROBS"], probs, rtol=0, atol=1e-6)
    assert (np.diff(out["PROBS"], axis=1) <= 0).all()  # best first


@pytest.mark.parametrize(
    "model,parameters,framework",
    [("digits_ensemble", None, "onnx"), ("digits_bls", None, "onnx"), ("digits_bls", {"framework": "torch"}, "torch")],
)
def test_pipelines_match_direct_run(server, split, expected, model, parameters, framework):
    labels, probs = [], []
    for i in range(0, len(split.test_images), 64):
        out = infer(server, model, {"IMAGE": split.test_images[i : i + 64]}, parameters=parameters)
        labels.append(out["LABELS"])
        probs.append(out["PROBS"])
    want_labels, want_probs = expected["top3"][framework]
    assert (np.concatenate(labels) == want_labels).all()
    np.testing.assert_allclose(np.concatenate(probs), want_probs, rtol=0, atol=1e-5)
    top1 = np.array([int(x) for x in np.concatenate(labels)[:, 0]])
    assert (top1 == split.test_labels).mean() >= 0.95


# ---------------------------------------------------------------- 16 concurrent clients
def _client_load(server, model, rows_by_request, make_inputs, check) -> int:
    """One client thread: its own gRPC client, its own requests, each answer checked against itself."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for rows in rows_by_request:
            out = infer(server, model, make_inputs(rows), client=client)
            check(rows, out)
    finally:
        client.close()
    return len(rows_by_request)


def _run_clients(server, model, n_items, make_inputs, check) -> None:
    rng = np.random.default_rng(7)
    plans = [
        [rng.choice(n_items, size=int(rng.integers(1, 4)), replace=False) for _ in range(REQUESTS_PER_CLIENT)]
        for _ in range(CLIENTS)
    ]
    barrier = threading.Barrier(CLIENTS)

    def worker(plan):
        barrier.wait(timeout=60)
        return _client_load(server, model, plan, make_inputs, check)

    with ThreadPoolExecutor(CLIENTS) as pool:
        done = sum(pool.map(worker, plans))
    assert done == CLIENTS * REQUESTS_PER_CLIENT


def _batch_sizes(server, model) -> dict[int, int]:
    stats = server.statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


@pytest.mark.parametrize("framework", ["torch", "onnx"])
def test_concurrent_clients_get_their_own_logits(server, expected, framework):
    model = f"digits_{framework}"
    pixels, logits = expected["pixels"], expected["logits"][framework]

    def check(rows, out):
        np.testing.assert_allclose(out["LOGITS"], logits[rows], rtol=0, atol=1e-5)

    _run_clients(server, model, len(pixels), lambda rows: {"PIXELS": pixels[rows]}, check)
    sizes = _batch_sizes(server, model)
    # Triton counts a batch by rows: several requests of 1..3 rows merged give sizes above 3.
    assert max(sizes) > 3, f"no request was batched with another: batch_stats {sizes}"


@pytest.mark.parametrize("model", ["digits_ensemble", "digits_bls"])
def test_concurrent_clients_through_pipelines(server, split, expected, model):
    labels, probs = expected["top3"]["onnx"]

    def check(rows, out):
        assert (out["LABELS"] == labels[rows]).all()
        np.testing.assert_allclose(out["PROBS"], probs[rows], rtol=0, atol=1e-5)

    _run_clients(server, model, len(split.test_images), lambda rows: {"IMAGE": split.test_images[rows]}, check)
    assert max(_batch_sizes(server, "digits_postprocess")) > 3


def _metric(text: str, name: str, model: str) -> float:
    match = re.search(rf'^{name}{{model="{model}"}} ([0-9.e+]+)$', text, re.M)
    assert match, f"{name} for {model} not in /metrics"
    return float(match.group(1))


@pytest.mark.parametrize("framework", ["torch", "onnx"])
def test_each_execute_runs_the_framework_once(server, expected, framework):
    """The model's own counters: one framework call per execute, every row of every request in it."""
    model = f"digits_{framework}"
    pixels = expected["pixels"]
    _run_clients(server, model, len(pixels), lambda rows: {"PIXELS": pixels[rows]}, lambda rows, out: None)
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()  # the model's counters: final once every answer is in
    runs, rows = _metric(text, "lab_framework_runs", model), _metric(text, "lab_framework_rows", model)
    # Triton's statistics count a request as it releases it, a moment after the answer: wait for them.
    stats = entry_when(server, model, lambda s: int(s["execution_count"]) >= runs and int(s["inference_count"]) >= rows)
    assert runs == int(stats["execution_count"])
    assert rows == int(stats["inference_count"])
    assert int(stats["execution_count"]) < int(stats["inference_count"])  # batches held several rows


# ---------------------------------------------------------------- errors: clear, and the server keeps serving
def _still_serves(server, split, expected):
    out = infer(server, "digits_ensemble", {"IMAGE": split.test_images[:2]})
    assert (out["LABELS"] == expected["top3"]["onnx"][0][:2]).all()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_wrong_dtype_is_refused_clearly(server, split, expected, protocol):
    with pytest.raises(InferenceServerException, match=r"data-type is 'FP64'.*expects 'FP32'"):
        infer(server, "digits_onnx", {"PIXELS": expected["pixels"][:2].astype(np.float64)}, protocol=protocol)
    _still_serves(server, split, expected)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_wrong_shape_is_refused_clearly(server, split, expected, protocol):
    with pytest.raises(InferenceServerException, match=r"(?i)shape"):
        infer(server, "digits_torch", {"PIXELS": expected["pixels"][:2, :63]}, protocol=protocol)
    with pytest.raises(InferenceServerException, match=r"(?i)batch.?size|exceeds"):
        infer(server, "digits_onnx", {"PIXELS": np.zeros((65, 64), np.float32)}, protocol=protocol)
    _still_serves(server, split, expected)


def test_out_of_range_image_is_refused_with_a_fix(server, split, expected):
    bad = (split.test_images[:2].astype(np.uint16) * 255 // 16).astype(np.uint8)
    for model in ("digits_preprocess", "digits_ensemble", "digits_bls"):
        with pytest.raises(InferenceServerException, match=r"IMAGE values must be 0\.\.16"):
            infer(server, model, {"IMAGE": bad})
    _still_serves(server, split, expected)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_framework_parameter(server, split, expected, protocol):
    with pytest.raises(
        InferenceServerException, match=r"'framework' must be one of \['onnx', 'torch'\], got 'tensorflow'"
    ):
        infer(
            server,
            "digits_bls",
            {"IMAGE": split.test_images[:1]},
            parameters={"framework": "tensorflow"},
            protocol=protocol,
        )
    _still_serves(server, split, expected)


def test_bad_request_in_a_batch_fails_alone(server, split, expected):
    """Concurrent good and bad BLS requests share batches; only the bad ones fail."""
    images = split.test_images
    labels = expected["top3"]["onnx"][0]

    def one(i):
        framework = "tensorflow" if i % 4 == 0 else "onnx"
        try:
            out = infer(server, "digits_bls", {"IMAGE": images[i : i + 1]}, parameters={"framework": framework},
                        client=clients[i % len(clients)])
            return i, out["LABELS"]
        except InferenceServerException as exc:
            return i, exc

    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(8)]
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(48)))
    finally:
        for c in clients:
            c.close()
    for i, result in results:
        if i % 4 == 0:
            assert isinstance(result, InferenceServerException) and "tensorflow" in result.message()
        else:
            assert not isinstance(result, Exception), result
            assert (result == labels[i : i + 1]).all()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_model_that_raises(server, split, expected, protocol):
    with pytest.raises(InferenceServerException, match="negative input is a deliberate bug"):
        infer(server, "raiser", {"INPUT0": -np.ones((1, 4), np.float32)}, protocol=protocol)
    ok = infer(server, "raiser", {"INPUT0": np.ones((1, 4), np.float32)}, protocol=protocol)["OUTPUT0"]
    np.testing.assert_array_equal(ok, np.ones((1, 4), np.float32))
    _still_serves(server, split, expected)
    assert server.is_running()


# ---------------------------------------------------------------- BLS children appear in traces
def test_bls_children_are_traced_under_their_parent(server, split):
    settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
    server.http_client.update_trace_settings("digits_bls", settings=settings, headers=server.admin_headers)
    try:
        infer(server, "digits_bls", {"IMAGE": split.test_images[:1]}, parameters={"framework": "torch"})
    finally:
        server.http_client.update_trace_settings("digits_bls", settings={"trace_level": ["OFF"]},
                                                 headers=server.admin_headers)
    records, deadline = [], time.monotonic() + 20
    wanted = {"digits_bls", "digits_preprocess", "digits_torch", "digits_postprocess"}
    while time.monotonic() < deadline:
        records = []
        for path in server.trace_file.parent.glob(server.trace_file.name + "*"):
            text = path.read_text().strip()
            if text:
                records += json.loads(text)
        if wanted <= {r.get("model_name") for r in records}:
            break
        time.sleep(0.2)
    by_model = {r["model_name"]: r for r in records if "model_name" in r}
    assert wanted <= set(by_model), f"traced models: {sorted(by_model)}"
    parent = by_model["digits_bls"]["id"]
    for child in wanted - {"digits_bls"}:
        assert by_model[child].get("parent_id") == parent, (child, by_model[child])
