"""The character model's weights as one raw file that C reads with a fixed header: ``charlm.raw``.

Why not let the C backend (``c_backends/lab_iterative``) read ``charlm.npz``: an ``.npz`` is a zip
archive of ``.npy`` files, each with a header that is a Python dict literal (dtype, order, shape);
reading it in C means a zip directory walk plus a parser for that literal. This layout needs none:
a fixed 24-byte header, the vocabulary's bytes, then the float32 arrays in a fixed order, so the C
side checks a magic, four sizes and the exact file length, and reads the rest with ``fread``.

Layout (little-endian; the C backend refuses to build on a big-endian machine)::

    0   8 bytes  magic b"CHARLM\\x00\\x01" (format version 1)
    8   uint32   CONTEXT   characters read before predicting the next one (24)
    12  uint32   V         vocabulary size
    16  uint32   E         embedding width
    20  uint32   H         hidden width
    24  V bytes  the vocabulary, one ASCII byte per character, then zero bytes up to a multiple of 4
    ... float32  emb [V, E], w1 [CONTEXT*E, H], b1 [H], w2 [H, H], b2 [H], w3 [H, V], b3 [V] (row-major)

``build.py`` writes it beside the ``.npz`` placements, into the C model's version folder, whenever
it is missing or older than the ``.npz`` (or this module): set-up keeps it fresh without retraining.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from lab_backends.errors import LabBackendsError

from .net import CONTEXT, Weights, load_weights

MAGIC = b"CHARLM\x00\x01"
HEADER = struct.Struct("<8sIIII")
#: The arrays after the vocabulary, in file order.
ORDER = ("emb", "w1", "b1", "w2", "b2", "w3", "b3")


def _padded(n: int) -> int:
    return (n + 3) // 4 * 4


def to_bytes(weights: Weights) -> bytes:
    """The whole file's content (see the module docstring)."""
    if not all(ord(c) < 128 for c in weights.vocab):
        raise LabBackendsError("charlm.raw stores one byte per character: the vocabulary must be ASCII")
    v, e = weights.emb.shape
    h = weights.w2.shape[0]
    shapes = {"emb": (v, e), "w1": (CONTEXT * e, h), "b1": (h,), "w2": (h, h), "b2": (h,), "w3": (h, v), "b3": (v,)}
    vocab = weights.vocab.encode("ascii")
    parts = [HEADER.pack(MAGIC, CONTEXT, v, e, h), vocab, b"\x00" * (_padded(len(vocab)) - len(vocab))]
    for name in ORDER:
        array = getattr(weights, name)
        if array.shape != shapes[name]:
            raise LabBackendsError(f"charlm weights: {name} has shape {array.shape}, expected {shapes[name]}")
        parts.append(np.ascontiguousarray(array, dtype="<f4").tobytes())
    return b"".join(parts)


def from_bytes(data: bytes) -> Weights:
    """Read the file back (the tests' check that the layout round-trips)."""
    magic, context, v, e, h = HEADER.unpack_from(data)
    if magic != MAGIC or context != CONTEXT:
        raise LabBackendsError(f"not a charlm.raw file of this version (magic {magic!r}, context {context})")
    offset = HEADER.size
    vocab = data[offset:offset + v].decode("ascii")
    offset += _padded(v)
    shapes = {"emb": (v, e), "w1": (context * e, h), "b1": (h,), "w2": (h, h), "b2": (h,), "w3": (h, v), "b3": (v,)}
    arrays = {}
    for name in ORDER:
        count = int(np.prod(shapes[name]))
        flat = np.frombuffer(data, dtype="<f4", count=count, offset=offset)
        arrays[name] = flat.reshape(shapes[name]).astype(np.float32)
        offset += 4 * count
    if offset != len(data):
        raise LabBackendsError(f"charlm.raw holds {len(data)} bytes, its header says {offset}")
    return Weights(vocab=vocab, **arrays)


def export_if_stale(npz: Path, target: Path) -> bool:
    """Write ``target`` from ``npz`` when it is missing or older than ``npz`` or this module; True if written."""
    newest = max(Path(npz).stat().st_mtime, Path(__file__).stat().st_mtime)
    if target.exists() and target.stat().st_mtime >= newest:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_bytes(to_bytes(load_weights(npz)))
    os.replace(tmp, target)  # atomic: a loading model never reads half a file
    return True
