"""Senders: each turns "send one request" into an awaitable that returns "" on success or an error text.

Two gRPC senders (raw ``grpc.aio`` bytes, and the stock ``tritonclient`` one to compare) and the HTTP
one of :mod:`.http_client`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import grpc
import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from lab_backends import learner
from lab_backends.client.limits import check_inputs
from lab_backends.client.wire import triton_dtype
from lab_backends.errors import LoadSettingError
from lab_backends.measure.loadgen.http_client import HttpSender
from lab_backends.measure.loadgen.payloads import grpc_request_bytes, http_request_bytes
from lab_backends.server.running import RunningServer

CLIENTS = ("grpc", "http", "grpc-tritonclient")
_GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


class _GrpcSender:
    """One HTTP/2 channel, many concurrent calls of a bytes-in/bytes-out ``ModelInfer`` method."""

    def __init__(self, url: str, body: bytes, timeout_s: float) -> None:
        self.url, self.body, self.timeout_s = url, body, timeout_s

    async def open(self) -> None:
        self._grpc = grpc
        self.channel = grpc.aio.insecure_channel(
            self.url, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        )
        self.call = self.channel.unary_unary(_GRPC_INFER)  # no serializers: bytes go out as they are

    async def send(self) -> str:
        try:
            await self.call(self.body, timeout=self.timeout_s, metadata=learner.metadata())
            return ""
        except self._grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

    async def close(self) -> None:
        await self.channel.close()


class _TritonclientGrpcSender:
    """The stock ``tritonclient.grpc.aio`` client, per-request objects and all (a baseline)."""

    def __init__(self, url: str, model: str, inputs: Mapping[str, np.ndarray], timeout_s: float) -> None:
        self.url, self.model, self.inputs, self.timeout_s = url, model, inputs, timeout_s

    async def open(self) -> None:
        self._module = aioclient
        self.client = aioclient.InferenceServerClient(self.url)

    async def send(self) -> str:
        tensors = []
        for name, array in self.inputs.items():
            tensor = self._module.InferInput(name, list(array.shape), triton_dtype(array))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        try:
            result = await self.client.infer(self.model, tensors, client_timeout=self.timeout_s)
            for output in result.get_response().outputs:
                result.as_numpy(output.name)
            return ""
        except InferenceServerException as exc:
            return str(exc)

    async def close(self) -> None:
        await self.client.close()


def make_sender(
    server: RunningServer, client: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
    timeout_s: float, max_connections: int,
):
    check_inputs(inputs)  # refuse overflowing/oversized shapes before any load
    if client == "grpc":
        return _GrpcSender(server.grpc_url, grpc_request_bytes(model, inputs, outputs), timeout_s)
    if client == "http":
        message = http_request_bytes(server.http_url, model, inputs, outputs)
        return HttpSender(server.http_url, message, timeout_s, max_connections)
    if client == "grpc-tritonclient":
        return _TritonclientGrpcSender(server.grpc_url, model, inputs, timeout_s)
    raise LoadSettingError(f"protocol must be one of {', '.join(CLIENTS)}, not {client!r}")
