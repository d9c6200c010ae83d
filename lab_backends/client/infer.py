"""One-call inference over either protocol, so notebooks and tests need not repeat boilerplate.

``infer(server, "cost_model", {"INPUT0": x})`` returns ``{"OUTPUT0": array}``. It uses
``tritonclient`` underneath (the real KServe v2 protocol), with binary tensors over HTTP.

Deferred import: ``tritonclient.http`` (gevent, ~0.1 s) at the first HTTP request: the ``client``
package imports this module and ``lab-backends --help`` imports the package (``with-key``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping, Sequence

import numpy as np
import tritonclient.grpc as grpcclient

from lab_backends import learner
from lab_backends.client import deadline
from lab_backends.client.limits import check_inputs
from lab_backends.client.wire import triton_dtype
from lab_backends.server.running import RunningServer

PROTOCOLS = ("grpc", "http")


def _module(protocol: str) -> ModuleType:
    """The tritonclient module that speaks ``protocol``."""
    if protocol == "grpc":
        return grpcclient
    if protocol == "http":
        import tritonclient.http as httpclient  # deferred: gevent-based, see the module docstring

        return httpclient
    raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")


def make_inputs(inputs: Mapping[str, np.ndarray], protocol: str = "grpc", binary: bool = True) -> list:
    """``tritonclient`` InferInput objects for named numpy arrays (BYTES for object/str arrays)."""
    module = _module(protocol)
    check_inputs(inputs)  # refuse overflowing/oversized shapes before sending
    made = []
    for name, array in inputs.items():
        array = np.asarray(array)
        tensor = module.InferInput(name, list(array.shape), triton_dtype(array))
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        made.append(tensor)
    return made


def infer(
    server: RunningServer,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    protocol: str = "grpc",
    parameters: Mapping[str, Any] | None = None,
    request_id: str = "",
    client: Any = None,
    **kwargs: Any,
) -> dict[str, np.ndarray]:
    """Run one inference and return every (or the named) output as numpy arrays.

    ``server`` is a :class:`~lab_backends.server.triton_server.TritonServer`; pass ``client`` to reuse your own.
    Extra keyword arguments (``sequence_id``, ``headers``, ...) go to ``client.infer``; in a class, a
    ``sequence_id`` is sent in the learner's own range (``learner.sequence_id``: no two learners share one).
    """
    if "sequence_id" in kwargs:
        kwargs["sequence_id"] = learner.sequence_id(kwargs["sequence_id"])
    if protocol == "grpc" and "client_timeout" not in kwargs and deadline.current() is not None:
        kwargs["client_timeout"] = deadline.current()  # while an exercise is judged: client/deadline.py
    module = _module(protocol)
    client = client or (server.grpc_client if protocol == "grpc" else server.http_client)
    requested = None
    if outputs is not None:
        requested = [
            module.InferRequestedOutput(name, binary_data=True)
            if protocol == "http"
            else module.InferRequestedOutput(name)
            for name in outputs
        ]
    result = client.infer(
        model,
        make_inputs(inputs, protocol),
        outputs=requested,
        parameters=dict(parameters) if parameters else None,
        request_id=request_id,
        **kwargs,
    )
    response = result.get_response(as_json=True) if protocol == "grpc" else result.get_response()
    names = outputs or [o["name"] for o in response["outputs"]]
    return {name: result.as_numpy(name) for name in names}
