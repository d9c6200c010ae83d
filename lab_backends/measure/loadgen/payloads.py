"""What one request carries, serialized once: example inputs, gRPC and HTTP/1.1 request bytes."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import triton_to_np_dtype

from lab_backends import learner
from lab_backends.client.wire import tensor_bytes, triton_dtype


def example_inputs(config: Any, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """One valid request's inputs for a model config (random values, variable dims set to 1).

    Integer inputs draw from 0..16 so that the digits models' ``IMAGE`` (values 0..16) is valid.
    """
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in config.input:
        dtype_name = model_config_pb2.DataType.Name(tensor.data_type).replace("TYPE_", "")
        if dtype_name == "STRING":
            dtype_name = "BYTES"
        dims = [d if d > 0 else 1 for d in tensor.dims]
        shape = ([batch] if config.max_batch_size > 0 else []) + dims
        if dtype_name == "BYTES":
            arrays[tensor.name] = np.full(shape, b"0", dtype=object)
            continue
        dtype = np.dtype(triton_to_np_dtype(dtype_name))
        if dtype.kind == "f":
            arrays[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arrays[tensor.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            arrays[tensor.name] = rng.integers(0, 17, shape).astype(dtype)
    return arrays


def grpc_request_bytes(
    model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, version: str = ""
) -> bytes:
    """A serialized ``ModelInferRequest`` with raw tensor contents, built once and resent as-is."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in inputs.items():
        datatype, raw = triton_dtype(array), tensor_bytes(array)
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(np.shape(array))
        request.raw_input_contents.append(raw)
    for name in outputs or []:
        request.outputs.add(name=name)
    return request.SerializeToString()


def http_request_bytes(
    host: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, version: str = ""
) -> bytes:
    """A complete HTTP/1.1 infer message: JSON header plus binary tensors (KServe binary extension)."""
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    blobs = []
    for name, array in inputs.items():
        datatype, raw = triton_dtype(array), tensor_bytes(array)
        header["inputs"].append(
            {"name": name, "shape": list(np.shape(array)), "datatype": datatype,
             "parameters": {"binary_data_size": len(raw)}}
        )
        blobs.append(raw)
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + b"".join(blobs)
    path = f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    identity = "".join(f"{k}: {v}\r\n" for k, v in learner.headers().items())  # a class's learner: the door's
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n{identity}"
        f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
