"""Refuse a request before it is sent when its shape cannot be right.

Triton 2.51 trusts the shape a client declares: a shape whose byte size overflows 64 bits, or a
JSON shape far larger than its data, has killed the server or a model's stub (docs/reliability.md).
The project's own senders (``client.infer``, ``client.protocol``, the load generator) check every
tensor here first, so a learner's mistake becomes a clear error on their side and the server they
share never sees it. The bound is stated, not guessed: ``MAX_REQUEST_BYTES`` (1 GiB, gRPC's own
ceiling is 2 GiB), or ``LAB_MAX_REQUEST_BYTES`` in the environment.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from lab_backends.errors import RequestTooLargeError

MAX_REQUEST_BYTES = int(os.environ.get("LAB_MAX_REQUEST_BYTES", 1 << 30))
_INT64_MAX = (1 << 63) - 1
#: Bytes per element of the fixed-size KServe v2 types; BYTES is counted at 4 (its length prefix) at least.
ITEM_BYTES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4,
}


def shape_bytes(name: str, shape: Iterable[Any], datatype: str, max_bytes: int = MAX_REQUEST_BYTES) -> int:
    """Byte size of a tensor of ``shape``/``datatype``; raise when it overflows int64 or passes ``max_bytes``."""
    dims = list(shape)
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
            raise RequestTooLargeError(
                f"input '{name}': shape {dims} has {d!r}; every dimension must be a non-negative integer"
            )
    elements = 1
    for d in dims:
        elements *= int(d)  # Python ints do not wrap: compare with what the server's int64 can hold
    size = elements * ITEM_BYTES.get(datatype.upper(), 1)
    if elements > _INT64_MAX or size > _INT64_MAX:
        raise RequestTooLargeError(
            f"input '{name}': shape {dims} of {datatype} has {elements} elements, whose byte size overflows "
            "64 bits; Triton 2.51 crashes on such shapes. Send the shape of the data you send."
        )
    if size > max_bytes:
        raise RequestTooLargeError(
            f"input '{name}': shape {dims} of {datatype} is {size:,} bytes, more than the bound of "
            f"{max_bytes:,} bytes per request; split it into smaller requests (or raise LAB_MAX_REQUEST_BYTES)"
        )
    return size


def check_inputs(inputs: Mapping[str, Any], max_bytes: int = MAX_REQUEST_BYTES) -> int:
    """Check every named array of a request; returns the request's total tensor bytes.

    A numpy array's shape cannot overflow, but its size can pass the bound, alone or together.
    """
    total = 0
    for name, array in inputs.items():
        array = np.asarray(array)
        if array.dtype.kind in "OSU":  # BYTES: at least a 4-byte length prefix per element
            total += shape_bytes(name, array.shape, "BYTES", max_bytes)
        else:
            total += shape_bytes(name, array.shape, "UINT8", max_bytes) * array.itemsize
    if total > max_bytes:
        raise RequestTooLargeError(
            f"the request's tensors hold {total:,} bytes together, more than the bound of {max_bytes:,}; "
            "split it into smaller requests (or raise LAB_MAX_REQUEST_BYTES)"
        )
    return total
