"""Export the trained MLP a third time: a TensorFlow SavedModel (for ``digits_tf`` and the native
``tensorflow_savedmodel`` config of ``model_repository_gpu``).

Nothing is retrained and nothing is downloaded: the trained PyTorch weights are copied into
TensorFlow variables, and the same three layers (``x @ W.T + b``, ReLU) are written as one
``tf.function`` whose serving signature uses the interface names: input ``PIXELS`` (float32
``[batch, 64]``, batch dynamic), output ``LOGITS`` (float32 ``[batch, 10]``). Those names are what
Triton's TensorFlow backend matches against a config, and what ``digits_tf/1/model.py`` calls.

TensorFlow is imported here, inside the functions, and nowhere at module level in the package:
importing it takes seconds and ~700 MB (docs/scale.md), which only the export step, the
``digits_tf`` stub and the offline check should pay.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .export import INPUT_NAME, OUTPUT_NAME
from .net import INPUT_SIZE

#: The signature the SavedModel serves (TensorFlow's default key; Triton's backend picks it by default).
SIGNATURE = "serving_default"
#: Read by TensorFlow when it is imported. ``TF_CPP_MIN_LOG_LEVEL=2``: only errors from its C++ side
#: (no INFO/WARNING start-up notices in the set-up output or the server log). ``TF_ENABLE_ONEDNN_OPTS=0``:
#: TensorFlow 2.21 prints its "oneDNN custom operations are on" notice (twice) whatever the log level,
#: and warns that oneDNN may change results with the computation order; its plain kernels print
#: nothing, and on this MLP give the same logits (5.7e-6 from PyTorch's either way, measured).
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def import_tensorflow(threads: int | None = 1) -> Any:
    """``import tensorflow`` with a quiet log and, when ``threads`` is set, pinned thread pools.

    TensorFlow fixes its intra-op and inter-op pool sizes when its runtime starts (the first op):
    set them right after the import, before anything runs, or they cannot change for this process.
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import tensorflow as tf

    if threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # the runtime already started in this process: its pools stay as they are
            pass
    return tf


def linear_layers(state_dict: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(W, b), ...]`` in order from a :class:`DigitsMLP` state dict (``layers.<i>.weight/bias``).

    ``W`` is transposed to ``[in, out]`` so that TensorFlow computes ``x @ W + b``, what
    ``torch.nn.Linear`` computes as ``x @ weight.T + bias``.
    """
    indices = sorted({int(key.split(".")[1]) for key in state_dict if key.endswith(".weight")})
    layers = []
    for i in indices:
        weight = np.asarray(_numpy(state_dict[f"layers.{i}.weight"]), dtype=np.float32)
        bias = np.asarray(_numpy(state_dict[f"layers.{i}.bias"]), dtype=np.float32)
        layers.append((np.ascontiguousarray(weight.T), bias))
    if not layers or layers[0][0].shape[0] != INPUT_SIZE:
        raise ValueError(f"not a digits MLP state dict: first layer {layers[0][0].shape if layers else None}")
    return layers


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def export_savedmodel(model_or_state: Any, path: Path) -> Path:
    """Write the MLP (a torch module or its state dict) as a SavedModel directory at ``path``.

    The directory is written beside ``path`` and renamed into place, so a server never loads half
    a model; an existing one is replaced.
    """
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    layers = linear_layers(state)
    tf = import_tensorflow()

    class DigitsTF(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = [tf.Variable(w, trainable=False, name=f"w{i}") for i, (w, _) in enumerate(layers)]
            self.biases = [tf.Variable(b, trainable=False, name=f"b{i}") for i, (_, b) in enumerate(layers)]

        @tf.function(input_signature=[tf.TensorSpec([None, INPUT_SIZE], tf.float32, name=INPUT_NAME)])
        def serve(self, pixels):
            x = pixels
            last = len(self.weights) - 1
            for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                x = tf.matmul(x, w) + b
                if i < last:
                    x = tf.nn.relu(x)
            return {OUTPUT_NAME: x}

    module = DigitsTF()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    old = path.with_name(f".{path.name}.old{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tf.saved_model.save(module, str(tmp), signatures={SIGNATURE: module.serve.get_concrete_function()})
        if path.exists():
            os.replace(path, old)  # a directory cannot be replaced by rename while it has files
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return path


def savedmodel_logits(pixels: np.ndarray, path: Path) -> np.ndarray:
    """LOGITS from a SavedModel, computed with TensorFlow (one thread) in this process."""
    tf = import_tensorflow()
    serve = tf.saved_model.load(str(path)).signatures[SIGNATURE]
    return serve(**{INPUT_NAME: tf.constant(np.ascontiguousarray(pixels, dtype=np.float32))})[OUTPUT_NAME].numpy()
