"""One drawn digit, one exchange with the server: fit it to a model's input, send it, keep the bytes.

Why a module of its own: the inspector must show the *exact* request and response, so it cannot go
through ``tritonclient``'s high-level ``infer`` (which hides the bytes). It reuses the hand-built
exchanges of :mod:`lab_backends.client.protocol` (JSON body, binary tensor extension, gRPC
protobufs) and adds what the inspector needs around them: which input a model wants (read from the
model's live config, never guessed), and the 10 class scores read back from whatever the model
answers (logits, probabilities, or a pipeline's top 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from lab_backends import rest
from lab_backends.client import protocol as wire_protocol
from lab_backends.digits.data import MAX_PIXEL, NUM_CLASSES, normalize
from lab_backends.errors import ProtocolError
from lab_backends.server.repository import config_from_json


def live_config(server: Any, model: str) -> Any:
    """The config ``model`` is served with, over plain REST (any thread may call this).

    Not ``server.model_config``: that goes through ``tritonclient.http``, which is gevent-based and
    fails ("Cannot switch to a different thread") when a widget's button callback runs on another
    thread than the cell that created the client, as ipykernel does.
    """
    status, body = rest.request(f"http://{server.http_url}/v2/models/{model}/config",
                                headers=server.admin_headers, timeout=10)
    if status != 200:
        raise ProtocolError(f"{model!r} is not served (HTTP {status}: {body.decode(errors='replace')[:200]}); "
                            f"load it first, e.g. server.load_model({model!r})")
    return config_from_json(json.loads(body))


#: The protocols a learner can pick: label -> (front end, binary body).
PROTOCOLS = {"REST JSON": ("http", False), "REST binary": ("http", True), "gRPC": ("grpc", True)}


@dataclass(frozen=True)
class InputFit:
    """How the drawing becomes the model's input tensor, and why (from the model's config)."""

    name: str
    tensor: np.ndarray
    how: str


def fit_input(config: Any, image: np.ndarray) -> InputFit:
    """The model's one input built from a raw 8x8 image (0..16), or a :class:`ProtocolError` saying why not.

    ``IMAGE uint8 [8, 8]`` models (the pipelines) get the raw drawing; ``PIXELS fp32 [64]`` models
    (the frameworks) get it normalized the one agreed way (``x / 8 - 1``), which is what
    ``digits_preprocess`` would have done on the server.
    """
    image = np.asarray(image)
    if image.shape != (8, 8):
        raise ProtocolError(f"a drawing is an 8x8 grid, got shape {image.shape}")
    if len(config.input) != 1:
        raise ProtocolError(f"{config.name} takes {len(config.input)} inputs; the pad fills models with one input")
    spec = config.input[0]
    dims = [int(d) for d in spec.dims]
    batched = config.max_batch_size > 0

    kind = mc.DataType.Name(spec.data_type)
    if kind == "TYPE_UINT8" and dims == [8, 8]:
        tensor = image.astype(np.uint8)
        how = f"the raw drawing as {spec.name} uint8 [8, 8] (values 0..{MAX_PIXEL})"
    elif kind == "TYPE_FP32" and dims in ([64], [8, 8]):
        tensor = normalize(image[None])[0].reshape(dims)
        how = f"{spec.name} fp32 {dims} = drawing / 8 - 1 (the preprocessing done client-side)"
    else:
        raise ProtocolError(
            f"{config.name} takes {spec.name} {kind} {dims}; a drawing fits only uint8 [8, 8] or fp32 [64]. "
            "Pick a digits model (digits_ensemble, digits_bls, digits_ensemble_c, digits_onnx, digits_torch)."
        )
    if batched:
        tensor = tensor[None]
    return InputFit(spec.name, np.ascontiguousarray(tensor), how)


@dataclass
class Sent:
    """One request on the wire and what came back."""

    protocol: str  # a key of PROTOCOLS
    request_id: str
    text: str  # the exchange as it looked on the wire (binary data elided to its size)
    request_bytes: int
    response_bytes: int
    latency_ms: float  # client round trip, for comparison with the server's trace only
    outputs: dict[str, np.ndarray]
    #: REST binary only: bytes of the JSON header before the raw tensor data (None otherwise).
    header_bytes: int | None = None


def send(server: Any, model: str, fit: InputFit, protocol: str, request_id: str) -> Sent:
    """Send ``fit`` once by ``protocol`` with ``request_id`` and keep both messages."""
    if protocol not in PROTOCOLS:
        raise ProtocolError(f"unknown protocol {protocol!r}; pick one of {', '.join(PROTOCOLS)}")
    front, binary = PROTOCOLS[protocol]
    inputs = {fit.name: fit.tensor}
    if front == "http":
        ex = wire_protocol.http_exchange(server, model, inputs, binary=binary, request_id=request_id)
        return Sent(protocol, request_id, ex.show(limit=1500), ex.request_size, ex.response_size,
                    ex.elapsed_ms, ex.outputs, ex.request_header_size if binary else None)
    gx = wire_protocol.grpc_exchange(server, model, inputs, request_id=request_id)
    return Sent(protocol, request_id, gx.show(), gx.request_size, gx.response_size, gx.elapsed_ms, gx.outputs)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def class_scores(outputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, int, str]:
    """``(scores[10], predicted digit, where the scores came from)`` from a model's answer.

    ``LOGITS`` get a softmax (the same one ``digits_postprocess`` applies on the server);
    ``PROBABILITIES`` are used as sent; a pipeline's ``LABELS``/``PROBS`` carry only its top 3, so the
    other 7 classes are NaN (shown as missing, not as zero: the server never said).
    """
    if "LOGITS" in outputs:
        logits = np.asarray(outputs["LOGITS"], np.float64).reshape(-1)[:NUM_CLASSES]
        scores, where = _softmax(logits), "softmax of the LOGITS tensor in the response"
    elif "PROBABILITIES" in outputs:
        scores = np.asarray(outputs["PROBABILITIES"], np.float64).reshape(-1)[:NUM_CLASSES]
        where = "the PROBABILITIES tensor in the response"
    elif "LABELS" in outputs and "PROBS" in outputs:
        labels = [int(v.decode() if isinstance(v, bytes) else v) for v in np.asarray(outputs["LABELS"]).reshape(-1)]
        probs = np.asarray(outputs["PROBS"], np.float64).reshape(-1)
        scores = np.full(NUM_CLASSES, np.nan)
        for label, p in zip(labels, probs):
            scores[label] = p
        where = "the LABELS/PROBS tensors in the response (the pipeline returns its top 3 only)"
    else:
        raise ProtocolError(f"no class scores in the answer: outputs are {sorted(outputs)}")
    return scores, int(np.nanargmax(scores)), where
