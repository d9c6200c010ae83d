"""Client helpers refuse shapes that overflow or pass the stated bound, before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest

from lab_backends.client import limits, protocol
from lab_backends.client.infer import make_inputs
from lab_backends.errors import RequestTooLargeError


def test_overflowing_shape_is_refused_with_the_reason():
    with pytest.raises(RequestTooLargeError, match="overflows 64 bits"):
        limits.shape_bytes("INPUT0", [1, 4611686018427387905], "FP32")
    with pytest.raises(RequestTooLargeError, match="non-negative"):
        limits.shape_bytes("INPUT0", [2, -1], "FP32")


def test_bound_is_stated_and_applies_to_every_sender():
    assert limits.shape_bytes("INPUT0", [2, 8], "FP32") == 64
    with pytest.raises(RequestTooLargeError, match="bound of 1,024 bytes"):
        limits.shape_bytes("INPUT0", [1099511627776], "FP32", max_bytes=1024)
    big = np.broadcast_to(np.float32(0), (limits.MAX_REQUEST_BYTES // 4 + 1,))  # no memory: a view
    for send in (lambda: make_inputs({"INPUT0": big}), lambda: protocol.request_body({"INPUT0": big}, binary=True),
                 lambda: protocol.grpc_request("echo", {"INPUT0": big})):
        with pytest.raises(RequestTooLargeError, match="split it into smaller requests"):
            send()


def test_load_generator_refuses_before_any_load():
    from lab_backends.measure.loadgen.senders import make_sender

    big = np.broadcast_to(np.float32(0), (limits.MAX_REQUEST_BYTES // 4 + 1,))
    with pytest.raises(RequestTooLargeError):
        make_sender(None, "grpc", "echo", {"INPUT0": big}, None, 1.0, 1)
