"""The front door's request rules (lab_backends/server/door_rules.py), without a server: every crasher of
Triton 2.51 is refused with a one-line reason, and a legitimate request of every model's shapes passes.
Costs about three seconds (the property test: 300 bodies)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from lab_backends.learner import SEQUENCE_SPAN
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.door_rules import (
    DOOR,
    MAX_DEPTH,
    VARIABLE_ELEMENTS,
    ModelRules,
    check_grpc,
    check_http,
    nesting_depth,
    parse_json,
)
from lab_backends.server.door_sequences import Owner, check_grpc_params, check_http_params, check_id, owner
from lab_backends.server.repository import model_dirs, read_config
from tests.reliability.test_crashes import HUGE_SHAPE, NESTED, binary_overflow_request

MODELS = {name: ModelRules.from_config(read_config(path), name)
          for name, path in model_dirs([MODEL_REPOSITORY]).items()}
ECHO = MODELS["echo"]
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
         "FP16": np.float16, "UINT32": np.uint32, "INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64,
         "INT64": np.int64, "FP64": np.float64, "BYTES": np.object_}


def _tensor(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"lesson"] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
    return np.ones(shape, NUMPY[datatype])


def _legit(model: ModelRules, batch: int, variable: int) -> dict[str, np.ndarray]:
    """One tensor per input of the model's config, at ``batch`` (if it batches), -1 dims of ``variable``."""
    lead = [batch] if model.max_batch_size else []
    return {name: _tensor(rule.datatype, lead + [variable if d < 0 else d for d in rule.dims])
            for name, rule in model.inputs.items()}


def _http_body(tensors: dict[str, np.ndarray], binary: bool) -> tuple[bytes, int | None]:
    inputs = []
    for name, array in tensors.items():
        datatype = "BYTES" if array.dtype == np.object_ else httpclient.np_to_triton_dtype(array.dtype)
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs)
    return body, header_length


def _grpc_request(model: str, tensors: dict[str, np.ndarray], raw: bool = True) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in tensors.items():
        datatype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            tensor_input = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor_input.set_data_from_numpy(array)
            request.raw_input_contents.append(tensor_input._get_content())
        elif datatype == "FP32":
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    return request


def _refused(refusal, status: int, *words: str) -> None:
    assert refusal is not None and refusal.status == status, refusal
    assert refusal.message.startswith(DOOR) and "\n" not in refusal.message, refusal
    assert all(word in refusal.message for word in words), refusal.message


# The crashers of Triton 2.51 (docs/reliability.md, platform notes "Crashers that need no size" and "Upstream defects").

def test_200000_nested_brackets_are_refused_before_any_parser_recurses():
    _refused(check_http("echo", ECHO, NESTED), 400, "nested 200001 deep", f"at most {MAX_DEPTH}")
    _refused(parse_json(NESTED)[1], 400, "nested")
    assert nesting_depth(b'{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"["}') == 1


def test_a_huge_json_shape_with_one_datum_is_refused():
    _refused(check_http("rel_double", None, HUGE_SHAPE), 400, "1,099,511,627,776 elements", "data has 1")
    _refused(check_http("echo", ECHO, HUGE_SHAPE), 413, "1,099,511,627,776 elements", f"allows {VARIABLE_ELEMENTS:,}")


@pytest.mark.parametrize("shape", [[4611686018427387905], [1, 4611686018427387905], [1 << 62, 4]])
def test_a_binary_shape_that_wraps_64_bits_is_refused_exactly(shape):
    body, headers = binary_overflow_request(shape)
    length = int(headers["Inference-Header-Content-Length"])
    _refused(check_http("x", None, body, length), 400, "binary_data_size is 4")
    refusal = check_http("echo", ECHO, body, length)
    assert refusal is not None and refusal.status in (400, 413), refusal


def test_grpc_shapes_that_wrap_or_claim_more_than_sent_are_refused():
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4611686018427387905])
    request.raw_input_contents.append(np.float32(1).tobytes())
    _refused(check_grpc(None, request), 400, "raw contents are 4")
    _refused(check_grpc(ECHO, request), 413, "allows")
    assert check_grpc(ECHO, request).grpc_code == "RESOURCE_EXHAUSTED"
    request.inputs[0].shape[:] = [-1]
    _refused(check_grpc(None, request), 400, "non-negative")
    assert check_grpc(None, request).grpc_code == "INVALID_ARGUMENT"
    typed = service_pb2.ModelInferRequest(model_name="echo")
    typed.inputs.add(name="INPUT0", datatype="FP32", shape=[1 << 40]).contents.fp32_contents.append(1.0)
    _refused(check_grpc(None, typed), 400, "contents have 1")


# Legitimate requests: every model of the repository, at batch 1 and at its max batch, JSON and binary, HTTP and gRPC.

@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_models_legitimate_requests_pass(name):
    model = MODELS[name]
    for batch in sorted({1, max(1, model.max_batch_size)}):
        tensors = _legit(model, batch, 16)
        for binary in (False, True):
            body, length = _http_body(tensors, binary)
            assert check_http(name, model, body, length) is None, (batch, binary)
        assert check_grpc(model, _grpc_request(name, tensors)) is None


def test_the_largest_lesson_request_passes_and_one_element_more_does_not():
    """Lesson 01's exercise sends 1 << 21 float32 to echo (binary and gRPC)."""
    big = np.zeros(VARIABLE_ELEMENTS, np.float32)
    body, length = _http_body({"INPUT0": big}, True)
    assert check_http("echo", ECHO, body, length) is None
    assert check_grpc(ECHO, _grpc_request("echo", {"INPUT0": big})) is None
    bigger = np.zeros(VARIABLE_ELEMENTS + 1, np.float32)
    body, length = _http_body({"INPUT0": bigger}, True)
    _refused(check_http("echo", ECHO, body, length), 413, "split it into smaller requests")
    _refused(check_grpc(ECHO, _grpc_request("echo", {"INPUT0": bigger})), 413)


def test_typed_grpc_contents_and_shared_memory_pass_when_consistent():
    x = np.ones((1, 64), np.float32)
    assert check_grpc(MODELS["digits_onnx"], _grpc_request("digits_onnx", {"PIXELS": x}, raw=False)) is None
    shm = {"name": "INPUT0", "shape": [1024], "datatype": "FP32",
           "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 4096}}
    assert check_http("echo", ECHO, json.dumps({"inputs": [shm]}).encode()) is None
    shm["shape"] = [1025]
    _refused(check_http("echo", ECHO, json.dumps({"inputs": [shm]}).encode()), 400, "shared memory holds 4,096")


# What learners really get wrong: named, with the fix.

@pytest.mark.parametrize("body, words", [
    (b"{not json", ("not valid JSON",)),
    (b"[]", ('"inputs" list',)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, 64], "datatype": "FP33", "data": []}]}', ("FP33",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, 63], "datatype": "FP32", "data": [1]}]}', ("[1..64, 64]",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [64], "datatype": "FP32", "data": [1]}]}', ("[1..64, 64]",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [65, 64], "datatype": "FP32", "data": [1]}]}', ("[1..64, 64]",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, 64], "datatype": "FP32", "data": [1, 2]}]}', ("data has 2",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, -64], "datatype": "FP32", "data": [1]}]}', ("non-negative",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, true], "datatype": "FP32", "data": [1]}]}', ("non-negative",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, 64], "datatype": "FP32"}]}', ("carries no data",)),
    (b'{"inputs": [{"name": "PIXELS", "shape": [1, 64], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 256}}]}', ("Inference-Header-Content-Length",)),
    (b'{"inputs": [], "outputs": "LOGITS"}', ('"outputs"',)),
])
def test_malformed_requests_are_named(body, words):
    _refused(check_http("digits_onnx", MODELS["digits_onnx"], body), 400, *words)


def test_binary_sizes_must_add_up_to_the_body():
    body, length = _http_body({"PIXELS": np.ones((1, 64), np.float32)}, True)
    _refused(check_http("digits_onnx", MODELS["digits_onnx"], body + b"xx", length), 400, "adds up to 256")
    _refused(check_http("digits_onnx", MODELS["digits_onnx"], body, len(body) + 1), 400, "Inference-Header")


def test_configs_without_inputs_get_the_data_checks_only():
    model = ModelRules("auto", 8)
    assert check_http("auto", model, b'{"inputs": [{"name": "X", "shape": [3], "datatype": "FP32", '
                                     b'"data": [1, 2, 3]}]}') is None
    _refused(check_http("auto", model, HUGE_SHAPE), 400, "data has 1")


# Whatever arrives, the rules answer None or a Refusal: an exception would be the gateway's 500, not a refusal.

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
INPUT = st.fixed_dictionaries({"name": st.sampled_from(["INPUT0", "PIXELS", "X", 3]),
                               "shape": st.lists(st.integers(-2, 1 << 64), max_size=3) | JSON,
                               "datatype": st.sampled_from(["FP32", "BYTES", "UINT8", "nope"]) | JSON},
                              optional={"data": JSON, "parameters": st.dictionaries(st.sampled_from(
                                  ["binary_data_size", "shared_memory_region", "shared_memory_byte_size"]), JSON)})


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode()),
                      st.lists(INPUT, max_size=3).map(lambda i: json.dumps({"inputs": i}).encode())),
       model=st.sampled_from(["echo", "digits_onnx", "generate_static", "unknown"]),
       header=st.none() | st.integers(-1, 80))
def test_any_body_gets_none_or_a_refusal_never_an_exception(body, model, header):
    answer = check_http(model, MODELS.get(model), body + b"\0" * 8, header)
    assert answer is None or (answer.status in (400, 413) and answer.message.startswith(DOOR))


# --- A class's sequence IDs (door_sequences, issue 46): each learner's own, whoever built the request ------------

DAEMON = owner("daemon")  # a real account: its UID comes from the system, as the gateway's does


def _http_sequence(sequence_id, start=False, end=False) -> tuple[bytes, int | None]:
    """tritonclient's own request body for ``running_mean``-like input, as a hand-made client sends it."""
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32), binary_data=False)
    body, length = httpclient.InferenceServerClient.generate_request_body(
        [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return body if isinstance(body, bytes) else body.encode(), length


def _grpc_sequence(sequence_id, start=False, end=False):
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    return _get_inference_request("echo", [tensor], "", "", None, sequence_id, start, end, 0, None, None)


def test_a_learners_owner_comes_from_the_systems_accounts():
    assert owner(None) is None and owner("-") is None  # no class, or the admin key: no range to hold to
    assert DAEMON == Owner("daemon", 1)
    assert owner("nosuchlearner") == Owner("nosuchlearner", None)


@pytest.mark.parametrize("start,end", [(False, False), (True, False), (False, True)])
def test_another_learners_sequence_ids_are_refused_over_http_and_grpc(start, end):
    """Injecting into, restarting (START) or ending (END) another learner's sequence: 403 / PERMISSION_DENIED,
    with the learner's own range and how the helpers map into it; their own IDs pass, as does 0."""
    mine = [1 * SEQUENCE_SPAN + 1, 1 * SEQUENCE_SPAN + 7, 2 * SEQUENCE_SPAN - 1, 0, "daemon:abc"]
    theirs = [65534 * SEQUENCE_SPAN + 7, 7, SEQUENCE_SPAN, 2 * SEQUENCE_SPAN, "abc", "daemonx:abc", "nobody:abc"]
    for sequence_id in mine + theirs:
        body, length = _http_sequence(sequence_id, start, end)
        http = check_http("echo", ECHO, body, length, lambda r: check_http_params(DAEMON, r))
        grpc = check_grpc_params(DAEMON, _grpc_sequence(sequence_id, start, end))
        if sequence_id in mine:
            assert http is None and grpc is None, (sequence_id, http, grpc)
        else:
            for refusal in (http, grpc):
                assert refusal is not None and refusal.status == 403 and refusal.grpc_code == "PERMISSION_DENIED"
                assert "\n" not in refusal.message and "map your IDs into it" in refusal.message
                assert ("4294967297..8589934591" if isinstance(sequence_id, int) else "'daemon:'") in refusal.message


def test_sequence_ids_are_read_as_triton_reads_them():
    """A negative int64 is the uint64 Triton sets (infer_handler.cc L217-L219); a key named twice is refused
    (Triton reads the first); a float or a bool is no ID; a learner without an account owns no number."""
    wrapped = _grpc_sequence(0)
    wrapped.parameters["sequence_id"].int64_param = -5  # Triton sets 2**64 - 5: UID 4294967295's range
    assert check_grpc_params(DAEMON, wrapped).status == 403
    assert check_grpc_params(Owner("top", (1 << 32) - 1), wrapped) is None
    twice = (b'{"parameters":{"sequence_id":7,"sequence_id":%d},"inputs":[{"name":"INPUT0","datatype":"FP32",'
             b'"shape":[1],"data":[1]}]}' % (SEQUENCE_SPAN + 7))
    refusal = check_http("echo", ECHO, twice, None, lambda r: check_http_params(DAEMON, r))
    assert refusal.status == 400 and "key twice" in refusal.message
    hidden = (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1099511627776],"shape":[1],"data":[1]}]}')
    assert "key twice" in check_http("echo", ECHO, hidden).message  # outside a class too: Triton sizes the first
    for bad in (7.0, True, None):
        body = json.dumps({"parameters": {"sequence_id": bad}, "inputs": json.loads(_http_sequence(0)[0])["inputs"]})
        assert check_http("echo", ECHO, body.encode(), None, lambda r: check_http_params(DAEMON, r)).status == 400
    assert check_id(Owner("ghost", None), SEQUENCE_SPAN + 1).status == 403 and check_id(Owner("ghost", None), 0) is None
    assert check_id(Owner("ghost", None), "ghost:1") is None
    body, length = _http_sequence(7)
    assert check_http("echo", ECHO, body, length, lambda r: check_http_params(None, r)) is None  # no class
    assert check_grpc_params(None, _grpc_sequence(7)) is None
