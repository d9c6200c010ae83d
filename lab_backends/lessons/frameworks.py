"""Notebook 05's toolkit: the same digits MLP served by three frameworks, compared fairly.

``digits_torch`` (TorchScript in PyTorch), ``digits_onnx`` (ONNX in ONNX Runtime) and ``digits_tf``
(a SavedModel in TensorFlow) are the same trained weights exported three times, each wrapped by a
Python-backend ``model.py``. Comparing them asks three questions, one function each (what each
framework costs the server to start and to keep, per stub process, is in :mod:`.framework_costs`):

* *do they answer the same?* :func:`served_logits` + :func:`agreement` on the held-out images;
* *how fast, under the same load?* :func:`side_by_side` (short, bounded closed-loop windows);
* *what do framework threads do?* :func:`thread_timings` times the very files the server loads,
  in this process, with 1 and with more intra-op threads (PyTorch and ONNX Runtime: importing
  TensorFlow here would add ~700 MB to the notebook's kernel, so TensorFlow's threads are read
  from its stub process instead).

On a GPU server (the NGC image from docker-compose, which also serves ``model_repository_gpu``)
:func:`gpu_status` finds the native ``onnxruntime``/``libtorch``/``tensorflow`` models on ``KIND_GPU`` instances,
and :data:`NATIVE` says which tensor names they use (libtorch: ``PIXELS__0`` by the
``<name>__<index>`` convention; forward()'s argument name ``pixels`` would do for the input too).

Deferred imports: torch (1-6 s) and ONNX Runtime (~0.1 s), only for the in-process thread timings.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from tritonclient.grpc import model_config_pb2 as mc

from lab_backends.client.infer import infer
from lab_backends.digits.build import ARTIFACT_DIR
from lab_backends.digits.data import load_split, normalize
from lab_backends.errors import LabBackendsError, RemoteServerError
from lab_backends.measure import loadgen
from lab_backends.measure.stats import scrape_metrics
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.running import RunningServer

#: The Python-wrapped models, by framework.
WRAPPED = {"torch": "digits_torch", "onnx": "digits_onnx", "tf": "digits_tf"}


@dataclass(frozen=True)
class ServedModel:
    """A digits model as served: its name, backend, and the tensor names it expects."""

    name: str
    framework: str
    backend: str
    input: str = "PIXELS"
    output: str = "LOGITS"


#: The native GPU models of ``model_repository_gpu`` (NGC image only: the embedded CPU server has
#: only the Python backend). libtorch binds inputs by forward()'s argument names, else by
#: ``<name>__<index>``, else in config order; outputs by ``<name>__<index>``, else in config order
#: (pytorch_backend src/libtorch.cc:1674-1764 at r24.10).
NATIVE = {
    "digits_onnx_gpu": ServedModel("digits_onnx_gpu", "onnx", "onnxruntime", "PIXELS", "LOGITS"),
    "digits_torch_gpu": ServedModel("digits_torch_gpu", "torch", "pytorch (libtorch)", "PIXELS__0", "LOGITS__0"),
    # The SavedModel's serving signature keys are the interface names (lab_backends/digits/export_tf.py).
    "digits_tf_gpu": ServedModel("digits_tf_gpu", "tf", "tensorflow", "PIXELS", "LOGITS"),
}
PYTHON_WRAPPED = {name: ServedModel(name, fw, "python") for fw, name in WRAPPED.items()}
#: Every digits framework model, wrapped and native.
SERVED = {**PYTHON_WRAPPED, **NATIVE}
#: The most rows one request may carry (``max_batch_size`` of every digits model).
MAX_BATCH = 64


def served(name: str) -> ServedModel:
    if name not in SERVED:
        raise LabBackendsError(f"{name!r} is not a digits framework model; known: {', '.join(SERVED)}")
    return SERVED[name]


# ------------------------------------------------------------------------------- the same answer?
def held_out() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Held-out raw images (uint8 [N, 8, 8]), their labels, and the normalized PIXELS [N, 64]."""
    split = load_split()
    return split.test_images, split.test_labels, normalize(split.test_images)


def served_logits(server: RunningServer, model: str, pixels: np.ndarray, max_batch: int = MAX_BATCH,
                  protocol: str = "grpc") -> np.ndarray:
    """LOGITS of ``model`` for every row of ``pixels``, in requests of at most ``max_batch`` rows.

    Why chunks: a request larger than the model's ``max_batch_size`` is refused (HTTP 400), so a
    client with more rows than that must split them and stitch the answers back in order.
    """
    spec = served(model)
    pixels = np.ascontiguousarray(pixels, dtype=np.float32)
    parts = [
        infer(server, model, {spec.input: pixels[i : i + max_batch]}, outputs=[spec.output], protocol=protocol)[
            spec.output
        ]
        for i in range(0, len(pixels), max_batch)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 10), np.float32)


def agreement(a: np.ndarray, b: np.ndarray, labels: np.ndarray | None = None) -> dict[str, float]:
    """How far two sets of logits are apart, and whether they pick the same digits."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        raise LabBackendsError(f"cannot compare logits of shapes {a.shape} and {b.shape}")
    out = {
        "rows": int(len(a)),
        "max_abs_diff": float(np.abs(a - b).max()) if a.size else 0.0,
        "same_labels": bool((a.argmax(1) == b.argmax(1)).all()),
    }
    if labels is not None:
        out["accuracy_a"] = float((a.argmax(1) == labels).mean())
        out["accuracy_b"] = float((b.argmax(1) == labels).mean())
    return out


def compare_table(results: Mapping[str, np.ndarray], reference: str, labels: np.ndarray) -> pd.DataFrame:
    """One row per model: its distance from ``reference``'s logits and its held-out accuracy."""
    rows = []
    for name, logits in results.items():
        cmp = agreement(results[reference], logits, labels)
        rows.append({"model": name, "backend": served(name).backend if name in SERVED else "",
                     "max_abs_diff_vs_" + reference: cmp["max_abs_diff"],
                     "same_labels": cmp["same_labels"], "accuracy": cmp["accuracy_b"]})
    return pd.DataFrame(rows).set_index("model")


# ------------------------------------------------------------------------------- speed, side by side
def side_by_side(
    server: RunningServer,
    models: Sequence[str],
    concurrencies: Sequence[int] = (1, 8),
    batch: int = 1,
    duration_s: float = 2.0,
    requests: int = 2000,
    warmup_requests: int = 20,
) -> pd.DataFrame:
    """Closed-loop windows for each model and concurrency: one tidy row each (``config`` = model).

    Every model gets the same inputs (real held-out digits) and the same load; models alternate
    within each concurrency so that a noisy neighbour on the machine hurts both alike.
    """
    _, _, pixels = held_out()
    rows = []
    for concurrency in concurrencies:
        for model in models:
            spec = served(model)
            result = loadgen.run_closed(
                server, model, concurrency, inputs={spec.input: pixels[:batch]}, outputs=[spec.output],
                requests=requests, duration_s=duration_s, warmup_requests=warmup_requests, warmup_s=1.0,
            )
            rows.append({"config": model, "backend": spec.backend, "batch": batch, **result.row()})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------- threads
def thread_timings(
    threads: Iterable[int] = (1, 2),
    batches: Iterable[int] = (1, 64),
    repeats: int = 200,
    torch_path: Any = None,
    onnx_path: Any = None,
) -> pd.DataFrame:
    """Microseconds per call of the served artifacts, in this process, per framework/threads/batch.

    ``us_per_call`` is the mean over ``repeats`` calls; ``us_median`` the median call, which a few
    calls preempted by another program on a busy machine do not move.

    This is what ``model.py`` pins with ``torch.set_num_threads(1)`` and ORT's
    ``intra_op_num_threads = 1``. Measured here rather than through the server because the thread
    count is fixed in ``initialize`` (it is per process, and torch allows setting inter-op threads
    only once). The torch setting is restored afterwards.
    """
    import onnxruntime as ort
    import torch

    torch_path = torch_path or ARTIFACT_DIR / "model.pt"
    onnx_path = onnx_path or ARTIFACT_DIR / "model.onnx"
    _, _, pixels = held_out()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is what model.py serves
        model = torch.jit.load(str(torch_path), map_location="cpu").eval()
    before = torch.get_num_threads()
    rows = []
    answers: dict[tuple[str, int], np.ndarray] = {}
    try:
        for n in threads:
            options = ort.SessionOptions()
            options.intra_op_num_threads = n
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
            torch.set_num_threads(n)
            for batch in batches:
                x = np.ascontiguousarray(np.resize(pixels, (batch, pixels.shape[1])))
                xt = torch.from_numpy(x)
                calls = {
                    "torch": lambda: model(xt),
                    "onnx": lambda: session.run(["LOGITS"], {"PIXELS": x}),
                }
                with torch.inference_mode():
                    for framework, call in calls.items():
                        for _ in range(5):
                            call()  # warm-up: first calls allocate
                        each = []
                        for _ in range(repeats):
                            start = time.perf_counter()
                            call()
                            each.append(time.perf_counter() - start)
                        us = sum(each) / repeats * 1e6
                        out = call()
                        out = np.asarray(out[0] if isinstance(out, list) else out)
                        first = answers.setdefault((framework, batch), out)
                        rows.append({"framework": framework, "threads": n, "batch": batch, "us_per_call": us,
                                     "us_median": float(np.median(each)) * 1e6, "us_per_row": us / batch,
                                     "max_abs_diff_vs_first": float(np.abs(out - first).max())})
    finally:
        torch.set_num_threads(before)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------- GPU
@dataclass
class GpuStatus:
    """Does this server have a GPU, how do we know, and which native GPU models does it serve?"""

    has_gpu: bool
    evidence: list[str] = field(default_factory=list)
    #: Native models (``model_repository_gpu``) that are READY on the server.
    native_ready: list[str] = field(default_factory=list)
    #: Native models the server knows of but that are not READY, with the reason it gives.
    native_broken: dict[str, str] = field(default_factory=dict)

    @property
    def can_compare(self) -> bool:
        return self.has_gpu and bool(self.native_ready)

    def message(self) -> str:
        if self.can_compare:
            return f"GPU server ({'; '.join(self.evidence)}): comparing {', '.join(self.native_ready)}"
        if self.has_gpu:
            why = "; ".join(f"{m}: {r}" for m, r in self.native_broken.items()) or "none in its repository index"
            return (f"the server has a GPU ({'; '.join(self.evidence)}) but no native GPU model is ready ({why}). "
                    "SKIPPING the native-backend comparison: serve model_repository_gpu (docker compose up).")
        return ("NO GPU on this server (no nv_gpu_* metrics, no *_gpu model ready): SKIPPING the KIND_GPU / "
                "native onnxruntime, libtorch and tensorflow comparison. Point TRITON_URL at the GPU stack "
                "(docs/gpu.md, `docker compose up`) to run it.")


def gpu_status(server: RunningServer) -> GpuStatus:
    """Look for a GPU the way a client can: GPU metrics, and native KIND_GPU models that loaded.

    Either is enough: Triton's ``nv_gpu_*`` metrics need DCGM, which may not start even on a GPU
    machine, while a ``KIND_GPU`` instance cannot load at all without a GPU.
    """
    evidence = []
    try:
        gpu_lines = [ln for ln in scrape_metrics(server).splitlines() if ln.startswith("nv_gpu_")]
    except Exception as exc:  # noqa: BLE001 - no metrics endpoint is itself an answer
        gpu_lines = []
        evidence.append(f"metrics unreadable: {exc}")
    if gpu_lines:
        uuids = sorted({ln.split('gpu_uuid="', 1)[1].split('"', 1)[0] for ln in gpu_lines if 'gpu_uuid="' in ln})
        evidence.append(f"{len(uuids) or 'some'} GPU(s) in nv_gpu_* metrics")
    try:
        index = {entry["name"]: entry for entry in server.repository_index()}
    except RemoteServerError:
        # A class's shared server keeps the repository API (and its admin key) from learners; the
        # per-model readiness endpoint is open, so ask each native model instead (no reasons then).
        index = {m: {"state": "READY"} for m in NATIVE if server.model_ready(m)}
    ready = [m for m in NATIVE if index.get(m, {}).get("state") == "READY"]
    broken = {m: index[m].get("reason") or index[m].get("state", "?") for m in NATIVE if m in index and m not in ready}
    if ready:
        evidence.append(f"KIND_GPU models ready: {', '.join(ready)}")
    has = [e for e in evidence if not e.startswith("metrics unreadable")]
    return GpuStatus(bool(has), evidence, ready, broken)


def instance_kinds(server: RunningServer, models: Iterable[str]) -> pd.DataFrame:
    """Backend/platform and instance groups of each model, from the configs the server uses."""
    rows = []
    for model in models:
        config = server.model_config(model)
        groups = [f"{mc.ModelInstanceGroup.Kind.Name(g.kind)} x{g.count}" for g in config.instance_group]
        rows.append({"model": model, "backend": config.backend or config.platform, "instances": ", ".join(groups),
                     "max_batch_size": config.max_batch_size})
    return pd.DataFrame(rows).set_index("model")


def pinning_lines() -> dict[str, list[str]]:
    """The lines of each wrapped model's ``model.py`` that pin framework threads (what the server runs)."""
    return {
        model: [ln.strip() for ln in (MODEL_REPOSITORY / model / "1" / "model.py").read_text().splitlines()
                if "threads" in ln and not ln.strip().startswith("#")]
        for model in WRAPPED.values()
    }


def framework_of(model: str) -> str:
    """``torch``, ``onnx`` or ``tf`` for a digits framework model."""
    return served(model).framework
