"""Direct, server-free answers from the built artifacts: what the served models must match.

Tests and notebooks compare Triton's outputs with these. They load the same files the servers
load, run them in this process, and implement the postprocessing independently of ``model.py``.

Deferred imports: torch (1-6 s) and ONNX Runtime (~0.1 s, its native runtime), each in the one
function that runs it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .build import ARTIFACT_DIR


def torch_logits(pixels: np.ndarray, path: Path = ARTIFACT_DIR / "model.pt") -> np.ndarray:
    """LOGITS from the TorchScript file, computed with PyTorch in this process."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript: what libtorch serves
        model = torch.jit.load(str(path)).eval()
    # One intra-op thread, as the served model.py pins it: the same kernels add in the same order, so
    # the server's answer can be compared bit for bit (with 2 threads the sums differ by ~4e-6).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return model(torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))).numpy()
    finally:
        torch.set_num_threads(before)


def onnx_logits(pixels: np.ndarray, path: Path = ARTIFACT_DIR / "model.onnx") -> np.ndarray:
    """LOGITS from the ONNX file, computed with ONNX Runtime in this process."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["LOGITS"], {"PIXELS": np.ascontiguousarray(pixels, dtype=np.float32)})[0]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def top_k(logits: np.ndarray, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Top-k digit labels (as bytes, best first) and their softmax probabilities."""
    probs = softmax(np.asarray(logits, dtype=np.float64))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    labels = np.vectorize(lambda d: str(d).encode())(order).astype(object)
    return labels, np.take_along_axis(probs, order, axis=1).astype(np.float32)


def tf_logits(pixels: np.ndarray, path: Path = ARTIFACT_DIR / "model.savedmodel") -> np.ndarray:
    """LOGITS from the SavedModel directory, computed with TensorFlow in this process (one thread).

    Imports TensorFlow (seconds, ~700 MB): for tests and offline checks, not for a notebook's kernel.
    """
    from .export_tf import savedmodel_logits

    return savedmodel_logits(pixels, path)
