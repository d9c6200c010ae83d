"""Property-based malformed KServe v2 requests (Hypothesis) against ONE live server.

Three generators: JSON bodies, binary bodies (header length, ``binary_data_size``, blob length)
and gRPC ``ModelInferRequest`` messages, with wrong datatypes, shapes, lengths, names and
parameters. Every answer must be a success or a client error with a message (Triton 2.51
answers a malformed JSON body with 500 "failed to parse the request JSON": an upstream quirk, see
docs/reliability.md), and after each one the server must answer a good request correctly.

Known crashers are excluded by name, each pinned by its own test in test_crashes.py:
``nested_json`` (deep '[' nesting: bodies here are at most 300 bytes), ``form_encoded_4mib``
(never form-encoded, and too short), ``huge_json_shape``
(JSON element counts above ``JSON_ELEMENTS_MAX``) and ``binary_shape_overflow`` (byte sizes that
overflow 64 bits, over HTTP and gRPC).
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from lab_backends import rest
from tests.reliability.conftest import known_good

pytestmark = pytest.mark.server

EXAMPLES = 110  # per generator: 330 malformed requests per run
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON_ELEMENTS_MAX = 1 << 20  # excluded above: "huge_json_shape" (test_crashes.py)
OVERFLOW = 1 << 63  # excluded at or above: "binary_shape_overflow" (test_crashes.py)
ITEM = {"FP32": 4, "INT32": 4, "FP64": 8, "INT8": 1, "BOOL": 1, "BYTES": 4, "FP16": 2, "UINT64": 8}

models = st.sampled_from(["rel_double", "cost_model", "no_such_model", ""])
names = st.sampled_from(["INPUT0", "INPUT1", "", "input0", "INPUT0 "]) | st.text(max_size=8)
datatypes = st.sampled_from([*ITEM, "fp32", "FLOAT", "", "STRING"])
dims = st.one_of(
    st.integers(-3, 20), st.integers(-(1 << 40), 1 << 40), st.sampled_from([0, 16, 1 << 31, (1 << 62) + 1])
)
shapes = st.lists(dims, max_size=4)
scalars = st.one_of(
    st.floats(allow_nan=True), st.integers(-(1 << 70), 1 << 70), st.booleans(), st.text(max_size=4), st.none()
)
parameters = st.dictionaries(
    st.sampled_from(["binary_data_size", "binary_data", "classification", "x"]),
    st.one_of(st.integers(-5, 1 << 40), st.booleans(), st.text(max_size=4)),
    max_size=2,
)


def _elements(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= abs(d)
    return n


#: Triton 2.51 answers a body whose JSON it cannot parse or walk with 500 (not 400), with these words.
UPSTREAM_500 = ("parse", "JSON", "attempt to ")


def _check_answer(status: int, body: bytes) -> None:
    text = body.decode(errors="replace")
    if status == 200:
        return
    upstream_500 = status == 500 and any(w in text for w in UPSTREAM_500)
    assert 400 <= status < 500 or upstream_500, (status, text)
    assert json.loads(body).get("error"), f"{status} without a message: {text!r}"


def _post(server, model: str, body: bytes, headers: dict[str, str]) -> None:
    status, answer = rest.request(f"http://{server.http_url}/v2/models/{model}/infer", "POST", body, headers, 20)
    _check_answer(status, answer)
    assert server.process.poll() is None, "the server died"
    known_good(server, "http")


@FUZZ
@given(
    model=models,
    inputs=st.lists(
        st.fixed_dictionaries(
            {"name": names, "shape": shapes, "datatype": datatypes},
            optional={"data": st.lists(scalars, max_size=20), "parameters": parameters},
        ),
        max_size=3,
    ),
    extra=st.dictionaries(
        st.sampled_from(["id", "outputs", "parameters", "inputs2"]),
        st.one_of(st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2)),
        max_size=2,
    ),
    raw=st.one_of(st.none(), st.binary(max_size=300)),
)
def test_malformed_json_bodies(rel_server, model, inputs, extra, raw):
    for tensor in inputs:
        # "huge_json_shape": a shape far larger than its data aborts the server (std::bad_alloc)
        assume(_elements(tensor["shape"]) * ITEM.get(tensor["datatype"], 8) < JSON_ELEMENTS_MAX)
    body = raw if raw is not None else json.dumps({"inputs": inputs, **extra}, default=str).encode()
    content = "text/plain" if raw is not None and len(body) % 2 else "application/json"
    _post(rel_server, model or "rel_double", body, {"Content-Type": content})


@FUZZ
@given(
    model=models,
    name=names,
    datatype=datatypes,
    shape=shapes,
    params=parameters,
    header_delta=st.integers(-40, 40) | st.just(0),
    blob=st.binary(max_size=256),
    size=st.one_of(st.none(), st.integers(-8, 1 << 40)),
)
def test_malformed_binary_requests(rel_server, model, name, datatype, shape, params, header_delta, blob, size):
    # "binary_shape_overflow": a byte size that wraps 64 bits kills a Python stub (and our C helpers)
    assume(_elements(shape) * ITEM.get(datatype, 8) < OVERFLOW)
    params = dict(params)
    if size is not None:
        params["binary_data_size"] = size
    header = json.dumps(
        {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "parameters": params}]}
    ).encode()
    length = max(0, len(header) + header_delta)
    _post(
        rel_server,
        model or "rel_double",
        header + blob,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)},
    )


_GOOD_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}


@pytest.fixture(scope="module")
def grpc_stub(rel_server):
    channel = grpc.insecure_channel(rel_server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@FUZZ
@given(
    model=models,
    version=st.sampled_from(["", "1", "2", "x"]),
    tensors=st.lists(st.tuples(names, datatypes, shapes, st.binary(max_size=128)), max_size=3),
    raw_extra=st.integers(-1, 1),
    param=st.one_of(st.none(), st.tuples(st.text(max_size=6), st.integers(-(1 << 62), 1 << 62))),
)
def test_malformed_grpc_messages(rel_server, grpc_stub, model, version, tensors, raw_extra, param):
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, blob in tensors:
        assume(_elements(shape) * ITEM.get(datatype, 8) < OVERFLOW)  # "binary_shape_overflow"
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(blob)
    if raw_extra > 0:
        request.raw_input_contents.append(b"\0" * 4)
    elif raw_extra < 0 and request.raw_input_contents:
        del request.raw_input_contents[-1]
    if param is not None:
        request.parameters[param[0]].int64_param = param[1]
    try:
        grpc_stub.ModelInfer(request, timeout=20)
    except grpc.RpcError as exc:
        assert exc.code() in _GOOD_CODES and exc.details(), (exc.code(), exc.details())
    assert rel_server.process.poll() is None, "the server died"
    known_good(rel_server, "grpc")


def test_known_good_reference_is_exact(rel_server):
    """The check used after each example really compares numbers (2·x), so it can fail."""
    from lab_backends.client.infer import infer

    x = np.ones((1, 16), dtype=np.float32)
    assert not np.array_equal(infer(rel_server, "rel_double", {"INPUT0": x})["OUTPUT0"], x)
