"""Notebook 06's toolkit: one digits pipeline, three ways to run it, compared.

preprocess -> framework model -> postprocess can run

* as an **ensemble** (``digits_ensemble``): a config that wires tensors between steps; Triton's
  ensemble scheduler moves them and no user code runs between the steps;
* as **BLS** (``digits_bls``): a Python ``model.py`` that calls the three models itself, so it can
  decide at run time (here: torch or onnx, from the request parameter ``framework``);
* **from the client**: three round trips, every intermediate tensor crossing the network twice.

:func:`answers` runs all of them on the same images, :func:`latencies` times them interleaved
(so a noisy neighbour hurts all alike), and :func:`ensemble_steps` / :func:`bls_source` show *how*
each is controlled.

Deferred import: matplotlib (~1 s), only when a figure is drawn.
"""

from __future__ import annotations

import ast
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from lab_backends.client.infer import infer
from lab_backends.errors import LabBackendsError
from lab_backends.measure.trace import read_trace
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.running import RunningServer

#: The three steps, as the ensemble and the BLS model call them (onnx by default).
STEPS = ("digits_preprocess", "digits_onnx", "digits_postprocess")
FRAMEWORKS = {"onnx": "digits_onnx", "torch": "digits_torch"}
#: Everything notebook 06 loads.
MODELS = ("digits_preprocess", "digits_onnx", "digits_torch", "digits_postprocess", "digits_ensemble", "digits_bls")
#: The ways to run the pipeline that :func:`run` knows.
WAYS = ("ensemble", "bls:onnx", "bls:torch", "client:onnx", "client:torch")


# ------------------------------------------------------------------------------- control, shown
def ensemble_steps(config: Any) -> pd.DataFrame:
    """The ensemble's steps as a table: which model, and which tensors flow in and out.

    The whole "program" of an ensemble is this table: a fixed graph, decided at load time.
    """
    if not config.HasField("ensemble_scheduling"):
        raise LabBackendsError(f"{config.name!r} is not an ensemble (platform {config.platform or config.backend!r})")
    rows = []
    for i, step in enumerate(config.ensemble_scheduling.step):
        rows.append({
            "step": i,
            "model": step.model_name,
            "inputs": ", ".join(f"{k} <- {v}" for k, v in sorted(step.input_map.items())),
            "outputs": ", ".join(f"{k} -> {v}" for k, v in sorted(step.output_map.items())),
        })
    return pd.DataFrame(rows).set_index("step")


def bls_source(function: str = "_pipeline", path: Path | None = None) -> str:
    """The source of one function of ``digits_bls``'s ``model.py``: the BLS model's control flow."""
    path = path or MODEL_REPOSITORY / "digits_bls" / "1" / "model.py"
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return ast.get_source_segment(text, node) or ""
    raise LabBackendsError(f"{path} has no function {function!r}")


# ------------------------------------------------------------------------------- the same answer
def client_pipeline(server: RunningServer, images: np.ndarray, framework: str = "onnx", protocol: str = "grpc",
                    request_id: str = "") -> dict[str, np.ndarray]:
    """The pipeline done by the client: three requests, tensors back and forth between them."""
    if framework not in FRAMEWORKS:
        raise LabBackendsError(f"framework must be one of {sorted(FRAMEWORKS)}, not {framework!r}")
    pixels = infer(server, "digits_preprocess", {"IMAGE": images}, protocol=protocol, request_id=request_id)["PIXELS"]
    logits = infer(server, FRAMEWORKS[framework], {"PIXELS": pixels}, protocol=protocol, request_id=request_id)[
        "LOGITS"
    ]
    return infer(server, "digits_postprocess", {"LOGITS": logits}, protocol=protocol, request_id=request_id)


def run(
    server: RunningServer, way: str, images: np.ndarray, protocol: str = "grpc", request_id: str = ""
) -> dict[str, np.ndarray]:
    """LABELS and PROBS for ``images``, computed one of the :data:`WAYS`."""
    kind, _, framework = way.partition(":")
    if way == "ensemble":
        return infer(server, "digits_ensemble", {"IMAGE": images}, protocol=protocol, request_id=request_id)
    if kind == "bls" and framework in FRAMEWORKS:
        return infer(server, "digits_bls", {"IMAGE": images}, protocol=protocol, request_id=request_id,
                     parameters={"framework": framework})
    if kind == "client" and framework in FRAMEWORKS:
        return client_pipeline(server, images, framework, protocol, request_id)
    raise LabBackendsError(f"unknown way {way!r}; choose one of {', '.join(WAYS)}")


def answers(server: RunningServer, images: np.ndarray, ways: Iterable[str] = WAYS) -> dict[str, dict[str, np.ndarray]]:
    return {way: run(server, way, images) for way in ways}


def same_answer(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], atol: float = 1e-5) -> bool:
    """Same top-3 labels, and probabilities equal within ``atol``."""
    return bool(np.array_equal(a["LABELS"], b["LABELS"]) and np.allclose(a["PROBS"], b["PROBS"], atol=atol))


# ------------------------------------------------------------------------------- overhead
def latencies(server: RunningServer, images: np.ndarray, ways: Iterable[str] = WAYS, repeats: int = 50,
              warmup: int = 3) -> pd.DataFrame:
    """One row per request: way, repeat, latency_ms. Ways are interleaved, one request at a time.

    One request in flight isolates the cost of the *path* (hops, copies, scheduling) from
    queueing; interleaving spreads the machine's noise evenly over the ways.
    """
    ways = list(ways)
    for way in ways:
        for _ in range(warmup):
            run(server, way, images)
    rows = []
    for i in range(repeats):
        for way in ways:
            start = time.perf_counter()
            run(server, way, images)
            rows.append({"way": way, "repeat": i, "latency_ms": (time.perf_counter() - start) * 1000.0})
    return pd.DataFrame(rows)


def latency_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Median, p90 and mean latency per way, fastest first."""
    grouped = frame.groupby("way")["latency_ms"]
    table = pd.DataFrame({"p50_ms": grouped.median(), "p90_ms": grouped.quantile(0.9), "mean_ms": grouped.mean(),
                          "requests": grouped.size()})
    return table.sort_values("p50_ms")


def family_breakdown(log: Any, request_id: str, model: str) -> dict[str, float]:
    """From a trace: the parent's total, the sum of its children's, and what is left (the glue)."""
    parent = log.request(request_id, model=model)
    children = log.children(int(parent["trace_id"]))
    inside = float(children["total_ms"].sum())
    return {"parent_ms": float(parent["total_ms"]), "children_ms": inside,
            "glue_ms": float(parent["total_ms"]) - inside, "children": int(len(children))}


#: The pipelines that run as one request with child requests (the client's three calls have no parent).
PARENTS = {"ensemble": "digits_ensemble", "bls:onnx": "digits_bls", "bls:torch": "digits_bls"}


def traced_glue(server: RunningServer, trace_path: Path, images: np.ndarray, repeats: int = 3) -> pd.DataFrame:
    """Per pipeline of :data:`PARENTS`: the median over ``repeats`` traced requests of each column of
    :func:`family_breakdown` (parent, children and glue ms, each its own median: they need not add up).

    Why a median of several: one request's glue is a few milliseconds, and one preemption by a
    neighbour lands in it whole; the median of a few interleaved requests is what the lesson's
    comparison of an ensemble's glue with BLS's can rest on. The server must trace every request.
    """
    tag = uuid.uuid4().hex[:6]
    ids = {way: [f"glue-{tag}-{way}-{i}" for i in range(repeats)] for way in PARENTS}
    for i in range(repeats):
        for way in PARENTS:
            run(server, way, images, request_id=ids[way][i])
    log = read_trace(trace_path, request_ids=[rid for rids in ids.values() for rid in rids])
    rows = {way: pd.DataFrame([family_breakdown(log, rid, PARENTS[way]) for rid in ids[way]]).median()
            for way in PARENTS}
    return pd.DataFrame(rows).T


def plot_latencies(frame: pd.DataFrame, ax: Any = None, title: str = "One digit, one request in flight") -> Any:
    """Latency distribution per way (box plot, fastest median first)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 3.5))
    order = latency_summary(frame).index.tolist()
    ax.boxplot([frame.loc[frame["way"] == w, "latency_ms"] for w in order], vert=False, showfliers=False)
    ax.set_yticks(range(1, len(order) + 1), order)
    ax.set_xlabel("latency (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    return ax
