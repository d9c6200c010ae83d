"""Audit cases of ``framework_agreement`` (notebook 05): LOGITS of all three served frameworks, in chunks."""

import numpy as np

from lab_backends.client.infer import infer
from lab_backends.digits import reference
from lab_backends.lessons.exercises.audit import Wrong


def _pixels(images):
    return images.reshape(len(images), 64).astype(np.float32) / 8 - 1


def _unchunked(server, model, images):
    return infer(server, model, {"PIXELS": _pixels(images)})["LOGITS"]


def _local(server, model, images):
    pixels = _pixels(images)
    return reference.onnx_logits(pixels) if model == "digits_onnx" else reference.torch_logits(pixels)


def _chunks(server, model, pixels, size):
    return [infer(server, model, {"PIXELS": pixels[i:i + size]})["LOGITS"] for i in range(0, len(pixels), size)]


def _unnormalized(server, model, images):
    return np.concatenate(_chunks(server, model, images.reshape(len(images), 64).astype(np.float32), 64))


def _reversed_chunks(server, model, images):
    return np.concatenate(_chunks(server, model, _pixels(images), 64)[::-1])


def _always_torch(server, model, images):
    return np.concatenate(_chunks(server, "digits_torch", _pixels(images), 64))  # ignores `model`


def _three_even_chunks(server, model, images):
    parts = np.array_split(_pixels(images), 3)  # 50 rows each, under max_batch_size
    return np.vstack([infer(server, model, {"PIXELS": p})["LOGITS"] for p in parts])


WRONG = [
    Wrong("sends all 150 rows at once", _unchunked, r"raised InferenceServerException"),
    Wrong("computes locally instead of on the server", _local, r"server computed 0 rows"),
    Wrong("forgets to normalize", _unnormalized, r"differs from the model's answer"),
    Wrong("stitches the chunks back in the wrong order", _reversed_chunks, r"differs from the model's answer"),
    Wrong("asks digits_torch whatever the model", _always_torch, r"server computed 0 rows for digits_onnx"),
]

ALTERNATIVES = [_three_even_chunks]
