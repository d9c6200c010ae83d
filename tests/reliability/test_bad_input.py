"""Bad input against a real server: each case gets a clear error, and the server keeps serving.

Every test sends one kind of bad request over the protocol(s) where it can be expressed, checks
the status and the words of Triton's answer (what is wrong, for which model), then sends a good
request and checks its answer.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.client.infer import infer
from lab_backends.measure.stats import entry_when

from .conftest import known_good

pytestmark = pytest.mark.server

PROTOCOLS = ("grpc", "http")
GOOD = np.ones((1, 16), dtype=np.float32)
#: What each protocol calls "your request is wrong" and "the model failed".
CLIENT_ERROR = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}
SERVER_ERROR = {"grpc": "StatusCode.INTERNAL", "http": "500"}


def _error(server, protocol, model, inputs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        infer(server, model, inputs, protocol=protocol)
    return caught.value


def _post(server, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    status, raw = rest.request(
        f"http://{server.http_url}{path}", "POST", body, headers or {"Content-Type": "application/json"}, timeout=60
    )
    return status, raw.decode(errors="replace")


def test_malformed_json_is_refused_with_the_parse_position(rel_server):
    status, body = _post(rel_server, "/v2/models/rel_double/infer", b'{"inputs": [ {"name": ')
    # Measured on 2.51: a JSON syntax error is answered 500 (not 400), with the parser's position.
    assert status in (400, 500), body
    assert "failed to parse the request JSON" in json.loads(body)["error"]
    known_good(rel_server, "http")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_is_named_in_a_not_found_error(rel_server, protocol):
    exc = _error(rel_server, protocol, "no_such_model", {"INPUT0": GOOD})
    assert exc.status() == {"grpc": "StatusCode.NOT_FOUND", "http": "404"}[protocol]
    assert "unknown model" in exc.message() and "'no_such_model'" in exc.message()
    known_good(rel_server, protocol)


CASES = {
    "wrong dtype": ({"INPUT0": GOOD.astype(np.int32)}, "data-type is 'INT32', but model 'rel_double' expects 'FP32'"),
    "wrong shape": ({"INPUT0": np.ones((1, 15), np.float32)}, "unexpected shape for input 'INPUT0'"),
    "batch above max_batch_size": ({"INPUT0": np.ones((9, 16), np.float32)}, "batch-size must be <= 8"),
    "missing input": ({}, "missing required input(s) ['INPUT0']"),
    "extra input": ({"INPUT0": GOOD, "EXTRA": GOOD}, "expected 1 inputs but got 2 inputs"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_invalid_request_is_a_client_error_that_says_what_is_wrong(rel_server, protocol, case):
    inputs, words = CASES[case]
    exc = _error(rel_server, protocol, "rel_double", inputs)
    assert exc.status() == CLIENT_ERROR[protocol], exc
    assert words in exc.message(), exc.message()
    known_good(rel_server, protocol)


def test_oversized_http_body_is_refused_by_size(rel_server):
    """64 MiB of tensor data for an input of 64 bytes: refused by byte count, server unharmed."""
    size = 64 << 20
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": size}}]}
    ).encode()
    status, body = _post(
        rel_server,
        "/v2/models/rel_double/infer",
        header + bytes(size),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400, body
    assert "input byte size mismatch" in body and "Expected 64, got 67108864" in body
    known_good(rel_server, "http")


def test_oversized_grpc_message_is_refused_by_size(rel_server):
    channel = grpc.insecure_channel(rel_server.grpc_url, options=[("grpc.max_send_message_length", -1)])
    try:
        request = service_pb2.ModelInferRequest(model_name="rel_double")
        tensor = request.inputs.add(name="INPUT0", datatype="FP32")
        tensor.shape.extend([1, 16])
        request.raw_input_contents.append(bytes(64 << 20))
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    finally:
        channel.close()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input byte size mismatch" in caught.value.details()
    known_good(rel_server, "grpc")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_that_raises_reports_its_exception_and_line(rel_server, protocol):
    exc = _error(rel_server, protocol, "rel_raise", {"INPUT0": GOOD})
    assert exc.status() == SERVER_ERROR[protocol]
    message = exc.message()
    assert "ValueError: rel_raise: deliberate failure in execute" in message
    assert "model.py(6): execute" in message  # the traceback points at the line
    known_good(rel_server, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("sign, returned", [(1, 2), (-1, 0)], ids=["one-too-many", "none"])
def test_wrong_number_of_responses_is_an_error_not_a_hang(rel_server, protocol, sign, returned):
    exc = _error(rel_server, protocol, "rel_wrong_count", {"INPUT0": sign * GOOD})
    assert exc.status() == SERVER_ERROR[protocol]
    assert "do not match the number of InferenceRequest objects" in exc.message()
    assert f"InferenceResponse(s) size is:{returned}" in exc.message()
    known_good(rel_server, protocol)


def test_errors_are_counted_as_failures_by_the_statistics_api(rel_server):
    """The misbehaving models' failures show in the (restricted) statistics, not as successes."""
    before = rel_server.statistics("rel_raise")["model_stats"][0]["inference_stats"]
    for _ in range(3):
        _error(rel_server, "grpc", "rel_raise", {"INPUT0": GOOD})
    # Counted as Triton releases each request, a moment after the client has its error: wait for it.
    after = entry_when(rel_server, "rel_raise",
                       lambda s: int(s["inference_stats"]["fail"]["count"]) >= int(before["fail"]["count"]) + 3
                       )["inference_stats"]
    assert int(after["fail"]["count"]) == int(before["fail"]["count"]) + 3
    assert int(after["success"]["count"]) == int(before["success"]["count"]) == 0
