"""The KServe v2 inference protocol on the wire, shown raw: what REST and gRPC really send.

``tritonclient`` hides the bytes; a learner should see them once. :func:`http_exchange` builds
the request body by hand (JSON, or JSON plus Triton's *binary tensor extension*), sends it with
``http.client`` and keeps every byte both ways; :func:`grpc_exchange` does the same with the
``ModelInfer`` protobuf messages. Both decode the outputs into numpy arrays, so a notebook can
assert that the two protocols returned the same tensor.

The binary extension in one sentence: the JSON header describes each tensor with
``"parameters": {"binary_data_size": N}`` instead of a ``"data"`` list, the raw little-endian bytes
follow the JSON, and the HTTP header ``Inference-Header-Content-Length`` says where the JSON ends.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import grpc
import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from lab_backends import learner, rest
from lab_backends.client.limits import check_inputs
from lab_backends.client.wire import tensor_bytes, triton_dtype
from lab_backends.errors import ProtocolError
from lab_backends.server.running import RunningServer

HEADER_LENGTH = "Inference-Header-Content-Length"


# ---------------------------------------------------------------------------------------- encoding
def _json_data(array: np.ndarray) -> list:
    flat = array.reshape(-1)
    if triton_dtype(array) == "BYTES":
        return [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
    return flat.tolist()


def request_body(
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    binary: bool = False,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of a KServe v2 ``infer`` request.

    With ``binary=False`` every element is written as JSON text; with ``binary=True`` the tensors
    travel as raw bytes after the JSON header and the outputs are asked for in binary too.
    """
    check_inputs(inputs)  # refuse overflowing/oversized shapes before sending
    header: dict[str, Any] = {}
    if request_id:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    header["inputs"] = []
    blobs = []
    for name, array in inputs.items():
        array = np.asarray(array)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": triton_dtype(array)}
        if binary:
            blob = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(array)
        header["inputs"].append(entry)
    if outputs:
        header["outputs"] = [
            {"name": o, **({"parameters": {"binary_data": True}} if binary else {})} for o in outputs
        ]
    elif binary:
        header["parameters"] = {**header.get("parameters", {}), "binary_data_output": True}
    text = json.dumps(header, separators=(",", ":")).encode()
    if not binary:
        return text, {"Content-Type": "application/json"}
    return text + b"".join(blobs), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(text))}


def decode_response(body: bytes, headers: Mapping[str, str]) -> tuple[dict, dict[str, np.ndarray]]:
    """Split a v2 response into its JSON header and numpy outputs (binary or JSON data)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    json_size = int(lowered.get(HEADER_LENGTH.lower(), len(body)))
    header = json.loads(body[:json_size])
    outputs: dict[str, np.ndarray] = {}
    offset = json_size
    for out in header.get("outputs", []):
        dtype, shape = out["datatype"], out["shape"]
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blob = body[offset : offset + size]
            offset += size
            if dtype == "BYTES":
                array = deserialize_bytes_tensor(blob)
            else:
                array = np.frombuffer(blob, dtype=np.dtype(triton_to_np_dtype(dtype)).newbyteorder("<"))
        else:
            data = out["data"]
            array = np.array([d.encode() for d in data], dtype=object) if dtype == "BYTES" else np.array(
                data, dtype=triton_to_np_dtype(dtype))
        outputs[out["name"]] = array.reshape(shape)
    return header, outputs


# ---------------------------------------------------------------------------------------- HTTP
def _elide(body: bytes, json_size: int | None, limit: int) -> str:
    head = body[:json_size] if json_size is not None else body
    text = head.decode(errors="replace")
    if len(text) > limit:
        text = text[:limit] + f"... <{len(head) - limit} more bytes of JSON>"
    if json_size is not None and len(body) > json_size:
        text += f"<{len(body) - json_size} bytes of binary tensor data>"
    return text


@dataclass
class HttpExchange:
    """One HTTP request and its response, byte for byte."""

    method: str
    path: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int
    response_headers: dict[str, str]
    response_body: bytes
    elapsed_ms: float
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def request_size(self) -> int:
        """Bytes of the request body (what the binary extension shrinks)."""
        return len(self.request_body)

    @property
    def response_size(self) -> int:
        return len(self.response_body)

    def _json_size(self, headers: Mapping[str, str]) -> int | None:
        lowered = {k.lower(): v for k, v in headers.items()}
        value = lowered.get(HEADER_LENGTH.lower())
        return int(value) if value is not None else None

    @property
    def request_header_size(self) -> int | None:
        """Bytes of the request's JSON header when binary tensors follow it (None for a pure-JSON body)."""
        return self._json_size(self.request_headers)

    @property
    def request_json(self) -> dict:
        size = self._json_size(self.request_headers)
        return json.loads(self.request_body[:size] if size is not None else self.request_body)

    @property
    def response_json(self) -> dict:
        size = self._json_size(self.response_headers)
        return json.loads(self.response_body[:size] if size is not None else self.response_body)

    def show(self, limit: int = 600) -> str:
        """The exchange as it looked on the wire (long JSON and binary data elided)."""
        lines = [f"{self.method} {self.path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in self.request_headers.items()]
        lines += ["", _elide(self.request_body, self._json_size(self.request_headers), limit), ""]
        lines += [f"HTTP/1.1 {self.status}"]
        lines += [f"{k}: {v}" for k, v in self.response_headers.items()]
        lines += ["", _elide(self.response_body, self._json_size(self.response_headers), limit)]
        return "\n".join(lines)


def http_exchange(
    server: RunningServer,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    binary: bool = False,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> HttpExchange:
    """POST one hand-built request to ``/v2/models/<model>/infer`` and keep every byte.

    Raises :class:`ProtocolError` with Triton's message when the server refuses it (e.g. 400 for a
    wrong shape): the same message a learner would get from ``curl``.
    """
    body, headers = request_body(inputs, outputs, binary, request_id, parameters)
    headers = {**headers, "Content-Length": str(len(body))}
    path = f"/v2/models/{model}/infer"
    host, _, port = server.http_url.rpartition(":")
    conn = connection or http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        response, payload, elapsed = timed_post(conn, path, body, headers)
    finally:
        if connection is None:
            conn.close()
    response_headers = {k: v for k, v in response.getheaders()}
    exchange = HttpExchange("POST", path, headers, body, response.status, response_headers, payload, elapsed)
    _, exchange.outputs = decode_response(payload, response_headers)
    return exchange


def timed_post(conn: http.client.HTTPConnection, path: str, body: bytes,
                headers: Mapping[str, str]) -> tuple[http.client.HTTPResponse, bytes, float]:
    """One POST on an open connection: the response, its whole body, and the round trip in ms.

    Public because the latency comparisons (client/latency.py, lessons/shared_memory.py) time their
    own bodies with the same clock as :func:`http_exchange`. In a class it also sends the learner's
    identity headers (:mod:`lab_backends.learner`; not in the exchange's shown headers).

    The clock runs from sending to having read the last byte; encoding and decoding stay outside.
    Raises :class:`ProtocolError` with Triton's message when the server refuses the request.
    """
    start = time.perf_counter()
    conn.request("POST", path, body=body, headers={**learner.headers(), **headers})
    response = conn.getresponse()
    payload = response.read()
    elapsed = (time.perf_counter() - start) * 1000
    if response.status != 200:
        raise ProtocolError(f"POST {path} answered HTTP {response.status}: {payload.decode(errors='replace')[:500]}")
    return response, payload, elapsed


# ---------------------------------------------------------------------------------------- gRPC
@dataclass
class GrpcExchange:
    """One ``ModelInfer`` call: the request and response protobufs and their serialized sizes."""

    request: Any
    response: Any
    elapsed_ms: float
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def request_size(self) -> int:
        return self.request.ByteSize()

    @property
    def response_size(self) -> int:
        return self.response.ByteSize()

    def show(self) -> str:
        """Both messages in protobuf text format, the raw tensor bytes replaced by their length."""
        def text(message: Any, raw_field: str) -> str:
            copy = type(message)()
            copy.CopyFrom(message)
            sizes = [len(b) for b in getattr(copy, raw_field)]
            del getattr(copy, raw_field)[:]
            out = text_format.MessageToString(copy)
            return out + "".join(f"{raw_field}: <{n} bytes of tensor data>\n" for n in sizes)

        return ("ModelInferRequest {\n" + text(self.request, "raw_input_contents") + "}\n"
                "ModelInferResponse {\n" + text(self.response, "raw_output_contents") + "}")


def grpc_request(model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
                 request_id: str = ""):
    """A ``ModelInferRequest`` protobuf with every tensor in ``raw_input_contents`` (always binary)."""
    check_inputs(inputs)
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs.items():
        array = np.asarray(array)
        request.inputs.add(name=name, datatype=triton_dtype(array), shape=list(array.shape))
        request.raw_input_contents.append(tensor_bytes(array))
    for name in outputs or []:
        request.outputs.add(name=name)
    return request


def grpc_exchange(server: RunningServer, model: str, inputs: Mapping[str, np.ndarray],
                  outputs: Sequence[str] | None = None, request_id: str = "") -> GrpcExchange:
    """Send one ``ModelInfer`` protobuf over a fresh channel and decode the response."""
    request = grpc_request(model, inputs, outputs, request_id)
    limit = 1 << 30
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", limit),
                                                        ("grpc.max_receive_message_length", limit)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        start = time.perf_counter()
        try:
            response = stub.ModelInfer(request, timeout=120, metadata=learner.metadata())
        except grpc.RpcError as exc:
            raise ProtocolError(f"ModelInfer on {model!r} failed: {exc.code().name}: {exc.details()}") from exc
        elapsed = (time.perf_counter() - start) * 1000
    decoded = {}
    for meta, raw in zip(response.outputs, response.raw_output_contents):
        if meta.datatype == "BYTES":
            array = deserialize_bytes_tensor(raw)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(triton_to_np_dtype(meta.datatype)).newbyteorder("<"))
        decoded[meta.name] = array.reshape(list(meta.shape))
    return GrpcExchange(request, response, elapsed, decoded)


# ---------------------------------------------------------------------------------------- plain REST calls
def rest_get(server: RunningServer, path: str, admin: bool = False) -> tuple[int, Any]:
    """``GET http://<server><path>`` -> (status, parsed JSON or text). ``admin`` sends the admin key."""
    return _rest(server, "GET", path, None, admin)


def rest_post(server: RunningServer, path: str, body: Any = None, admin: bool = False) -> tuple[int, Any]:
    """``POST`` a JSON body -> (status, parsed JSON or text). ``admin`` sends the admin key."""
    return _rest(server, "POST", path, json.dumps(body if body is not None else {}).encode(), admin)


def _rest(server: RunningServer, method: str, path: str, body: bytes | None, admin: bool) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if admin:
        headers.update(server.admin_headers)
    status, payload = rest.request(f"http://{server.http_url}{path}", method, body, headers, timeout=30)
    try:
        return status, json.loads(payload) if payload else None
    except json.JSONDecodeError:
        return status, payload.decode(errors="replace")

