"""lab_backends.client.protocol: hand-built KServe v2 requests, checked byte by byte and against a real server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab_backends.client import protocol
from lab_backends.client.latency import compare_latency
from lab_backends.errors import ProtocolError


def test_json_body_is_plain_kserve_v2() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, headers = protocol.request_body({"IN": x}, outputs=["OUT"], request_id="r1")
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(body) == {
        "id": "r1",
        "inputs": [{"name": "IN", "shape": [2, 3], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}],
        "outputs": [{"name": "OUT"}],
    }


def test_binary_body_puts_raw_bytes_after_the_json_header() -> None:
    x = np.arange(4, dtype=np.int32)
    body, headers = protocol.request_body({"IN": x}, outputs=["OUT"], binary=True)
    size = int(headers[protocol.HEADER_LENGTH])
    header = json.loads(body[:size])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 16}
    assert header["outputs"] == [{"name": "OUT", "parameters": {"binary_data": True}}]
    assert body[size:] == x.astype("<i4").tobytes()


def test_decode_binary_and_json_responses_including_bytes() -> None:
    labels = np.array([b"7", b"1", b"22"], dtype=object)
    probs = np.array([0.5, 0.25, 0.25], dtype=np.float32)
    body, headers = protocol.request_body({"LABELS": labels, "PROBS": probs}, binary=True)
    # A response has the same layout with "outputs": re-label our request as one.
    size = int(headers[protocol.HEADER_LENGTH])
    header = json.loads(body[:size])
    reply = json.dumps({"outputs": header["inputs"]}).encode()
    decoded_header, outputs = protocol.decode_response(reply + body[size:], {protocol.HEADER_LENGTH: str(len(reply))})
    assert list(outputs["LABELS"]) == [b"7", b"1", b"22"]
    np.testing.assert_array_equal(outputs["PROBS"], probs)
    as_json = json.dumps({"outputs": [
        {"name": "P", "datatype": "FP32", "shape": [3], "data": [0.5, 0.25, 0.25]},
        {"name": "L", "datatype": "BYTES", "shape": [1], "data": ["x"]},
    ]}).encode()
    _, outputs = protocol.decode_response(as_json, {})
    assert outputs["P"].dtype == np.float32 and list(outputs["L"]) == [b"x"]


@pytest.mark.server
def test_rest_json_rest_binary_and_grpc_agree_on_a_real_server(start_server) -> None:
    server = start_server(models=["cost_model", "echo"])
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    rest = protocol.http_exchange(server, "cost_model", {"INPUT0": x}, outputs=["OUTPUT0"], request_id="a")
    binary = protocol.http_exchange(server, "cost_model", {"INPUT0": x}, binary=True)
    grpc_ex = protocol.grpc_exchange(server, "cost_model", {"INPUT0": x})
    for exchange in (rest, binary, grpc_ex):
        np.testing.assert_array_equal(exchange.outputs["OUTPUT0"], x)
    assert rest.response_json["id"] == "a" and rest.request_json["inputs"][0]["shape"] == [2, 16]
    assert binary.request_size < rest.request_size and binary.response_size < rest.response_size
    assert "binary tensor data" in binary.show() and '"data":[' in rest.show()
    assert "raw_input_contents: <128 bytes" in grpc_ex.show()

    table = compare_latency(server, "echo", {"INPUT0": x.reshape(-1)}, repeats=3, warmup=1)
    assert list(table["requests"]) == [3, 3, 3]
    assert table.loc["REST, binary tensors", "request_bytes"] < table.loc["REST, JSON tensors", "request_bytes"]

    status, meta = protocol.rest_get(server, "/v2")
    assert status == 200 and "binary_tensor_data" in meta["extensions"]
    assert protocol.rest_post(server, "/v2/repository/index")[0] == 403
    status, index = protocol.rest_post(server, "/v2/repository/index", admin=True)
    assert status == 200 and {"cost_model", "echo"} <= {m["name"] for m in index}


@pytest.mark.server
def test_refused_requests_raise_protocol_error_with_tritons_words(start_server) -> None:
    server = start_server(models=["cost_model"])
    with pytest.raises(ProtocolError, match="HTTP 400.*unexpected shape"):
        protocol.http_exchange(server, "cost_model", {"INPUT0": np.ones(16, np.float32)})
    with pytest.raises(ProtocolError, match="INVALID_ARGUMENT"):
        protocol.grpc_exchange(server, "cost_model", {"INPUT0": np.ones(16, np.float32)})
    with pytest.raises(ValueError, match="repeats"):
        compare_latency(server, "cost_model", {"INPUT0": np.ones((1, 16), np.float32)}, repeats=0)
