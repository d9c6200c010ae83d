"""How a numpy array travels in the KServe v2 protocol: its Triton datatype and its raw bytes.

One rule for every encoder of the package (``infer``'s InferInputs, the hand-built HTTP messages of
:mod:`lab_backends.client.protocol`, the load generator's prepared requests): strings and Python
objects travel as ``BYTES`` (each element length-prefixed), everything else as its numpy type,
little-endian, row after row.
"""

from __future__ import annotations

import numpy as np
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor


def triton_dtype(array: np.ndarray) -> str:
    """The Triton datatype of ``array`` (``BYTES`` for object, bytes and str arrays)."""
    array = np.asarray(array)
    return "BYTES" if array.dtype.kind in "OSU" else np_to_triton_dtype(array.dtype)


def tensor_bytes(array: np.ndarray) -> bytes:
    """The raw contents of ``array`` as the binary extension and gRPC ``raw_input_contents`` carry them."""
    array = np.asarray(array)
    if triton_dtype(array) == "BYTES":
        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size > 0 else b""  # a 0-d object array holding the bytes
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
