"""Consume a decoupled model's response stream, over gRPC and over HTTP (SSE), the same way.

A decoupled model (``model_transaction_policy { decoupled: true }``) may send any number of
responses to one request, at any time. A plain request/response call cannot carry that, so Triton
offers two streaming doors:

* gRPC ``ModelStreamInfer``: a bidirectional stream; every response arrives through a callback,
  and with ``enable_empty_final_response`` the last one carries ``triton_final_response`` (so the
  client knows the stream of *this request* is over, even when it sent no data);
* HTTP ``POST /v2/models/<m>/generate_stream``: the generate extension, JSON in, Server-Sent Events
  out (``data: {...}`` lines), one event per response; the connection closes after the final one.

Both functions return the same :class:`StreamEvent` list, with each event's tensors reduced to plain
Python values, so a notebook can assert that the two doors delivered the same sequence.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd
import tritonclient.grpc as grpcclient

from lab_backends import learner
from lab_backends.client.infer import make_inputs
from lab_backends.errors import StreamingError
from lab_backends.server.running import RunningServer

#: Keys that ``generate_stream`` adds to every event besides the model's outputs.
SSE_META = ("model_name", "model_version", "id", "parameters")


@dataclass
class StreamEvent:
    """One response of a stream: when it arrived, its outputs as plain values, or its error."""

    t_s: float
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    final: bool = False

    @property
    def has_data(self) -> bool:
        return bool(self.outputs)


def _plain(array: np.ndarray) -> Any:
    """A response tensor as the value JSON would show: str for bytes, a scalar for size 1."""
    values = [v.decode() if isinstance(v, bytes) else v.item() for v in np.asarray(array).reshape(-1)]
    return values[0] if len(values) == 1 else values


def grpc_stream(
    server: RunningServer,
    model: str,
    inputs: Mapping[str, np.ndarray],
    timeout_s: float = 30.0,
    request_id: str = "stream-1",
) -> list[StreamEvent]:
    """Send one request on a gRPC stream and collect every response until the final flag (or an error).

    A fresh client per call: a tritonclient gRPC client holds at most one stream, and stopping it
    ends the stream for every request on it. Past the deadline the request is cancelled as the stream
    stops: ``stop_stream()`` without ``cancel_requests`` waits for every request on the stream to end,
    so a model that never sends FINAL would hang the timeout instead of raising it.
    """
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((time.monotonic(), result, error)))
    received: list[StreamEvent] = []
    ended = False
    try:
        start = time.monotonic()
        client.async_stream_infer(model, make_inputs(inputs), request_id=request_id, enable_empty_final_response=True)
        deadline = start + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                at, result, error = events.get(timeout=max(0.01, left))
            except queue.Empty:
                raise StreamingError(
                    f"the gRPC stream of '{model}' sent {len(received)} response(s) but no final one within "
                    f"{timeout_s:.0f} s; a decoupled model must close each request with the FINAL flag"
                ) from None
            if error is not None:
                received.append(StreamEvent(at - start, error=str(error), final=True))
                ended = True
                return received
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            outputs = {o.name: _plain(result.as_numpy(o.name)) for o in response.outputs}
            received.append(StreamEvent(at - start, outputs, final=final))
            if final:
                ended = True
                return received
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()


def sse_stream(
    server: RunningServer, model: str, body: Mapping[str, Any], timeout_s: float = 30.0
) -> tuple[int, list[StreamEvent]]:
    """``POST /v2/models/<model>/generate_stream`` and read its Server-Sent Events as they come.

    ``body`` holds the inputs by name as JSON values (``{"LOGITS": [...], "K": 3}``). Returns the
    HTTP status and the events; a request refused before the first response (bad shape, say) comes
    back as one error event with status 4xx. The last event is marked final: the server closes the
    stream after the model's final flag.
    """
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/generate_stream",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **learner.headers()},
        method="POST",
    )
    events: list[StreamEvent] = []
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = response.status
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue  # blank separator lines between events
                payload = json.loads(line[5:])
                at = time.monotonic() - start
                if "error" in payload:
                    events.append(StreamEvent(at, error=str(payload["error"])))
                else:
                    events.append(StreamEvent(at, {k: v for k, v in payload.items() if k not in SSE_META}))
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace").strip()
        text = text[5:] if text.startswith("data:") else text
        try:
            message = json.loads(text).get("error", text)
        except json.JSONDecodeError:
            message = text
        return exc.code, [StreamEvent(0.0, error=str(message), final=True)]
    except OSError as exc:
        raise StreamingError(f"generate_stream of '{model}' at {server.http_url} failed: {exc}") from exc
    if events:
        events[-1].final = True
    return status, events


def data_events(events: list[StreamEvent]) -> list[dict[str, Any]]:
    """The outputs of the events that carry data, in arrival order (drops an empty final response)."""
    return [e.outputs for e in events if e.has_data]


def same_sequence(a: list[StreamEvent], b: list[StreamEvent], rtol: float = 1e-6) -> bool:
    """Did two streams deliver the same responses in the same order (floats within ``rtol``)?"""
    left, right = data_events(a), data_events(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if set(x) != set(y):
            return False
        for key in x:
            if isinstance(x[key], float) or isinstance(y[key], float):
                if not np.allclose(x[key], y[key], rtol=rtol, atol=0):
                    return False
            elif x[key] != y[key]:
                return False
    return True


def as_frame(events: list[StreamEvent]):
    """The events as a DataFrame: arrival time, outputs, error, final (for a notebook table)."""
    frame = pd.DataFrame([{"t_ms": round(e.t_s * 1000, 1), **e.outputs, "error": e.error, "final": e.final}
                          for e in events])
    return frame.convert_dtypes()  # an empty final response leaves <NA>, and STEP stays an integer
