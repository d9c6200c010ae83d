"""The serving architecture of Triton as one matplotlib figure, optionally with *your* models on it.

Left to right, the path of one request: the front ends (HTTP/REST, gRPC) hand it to the model
manager, which knows the repository; each model has its own scheduler (default, dynamic batcher,
sequence batcher or ensemble), and the scheduler hands batches to a backend (python, a C backend,
or a framework backend such as ONNX Runtime or PyTorch in the NGC image). The response travels the
same way back. Passing the server's model configs places each model under the scheduler and the
backend its config picks, so the picture matches the server that is running.

Deferred import: matplotlib (~1 s), only when the diagram is drawn.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

#: Scheduler names as this workbench shows them, in the order they are drawn.
SCHEDULERS = ("default", "dynamic batcher", "sequence batcher", "ensemble")
#: Backend boxes: what runs here, and what only the NGC image (GPU stack) brings.
BACKENDS = ("python", "C (custom)", "onnxruntime (NGC)", "pytorch (NGC)")


def scheduler_of(config: Any) -> str:
    """Which scheduler Triton gives a model, from its ``ModelConfig`` (the rules of model_config.proto)."""
    if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
        return "ensemble"
    if config.HasField("sequence_batching"):
        return "sequence batcher"
    if config.HasField("dynamic_batching"):
        return "dynamic batcher"
    return "default"


def backend_of(config: Any) -> str:
    """The backend box a model belongs in (``None``-like ensembles run no backend of their own)."""
    name = config.backend or config.platform
    if name == "ensemble":
        return "(none: steps run in other models)"
    if name == "python":
        return "python"
    if name in ("onnxruntime", "onnxruntime_onnx"):
        return "onnxruntime (NGC)"
    if name in ("pytorch", "pytorch_libtorch"):
        return "pytorch (NGC)"
    return "C (custom)" if name else "unknown"


def _box(ax: Any, x: float, y: float, w: float, h: float, text: str, color: str, size: int = 9,
         weight: str = "normal") -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#333333", linewidth=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight, wrap=True)


def _arrow(ax: Any, start: tuple[float, float], end: tuple[float, float], color: str = "#333333",
           style: str = "-|>") -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, linewidth=1.2))


def architecture_diagram(configs: Mapping[str, Any] | None = None, ax: Any = None, title: str | None = None):
    """Draw the architecture; with ``configs`` (name -> ``ModelConfig``) list each model in its boxes.

    Returns the matplotlib Axes. Use :func:`model_placement` for the same information as a table.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(13, 6.2))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 7)
    ax.axis("off")
    placement = model_placement(configs or {})

    # Column 0: the client.
    _box(ax, 0.1, 2.9, 1.3, 1.2, "client\n(tritonclient,\ncurl, browser)", "#eeeeee")
    # Column 1: front ends.
    _box(ax, 2.0, 4.3, 1.9, 1.0, "HTTP/REST\nKServe v2 JSON\n(+ binary tensors)", "#c6dbef")
    _box(ax, 2.0, 2.9, 1.9, 1.0, "gRPC\nKServe v2 protobuf", "#c6dbef")
    _box(ax, 2.0, 1.5, 1.9, 1.0, "C API\n(in-process)", "#deebf7", size=8)
    ax.text(2.95, 5.6, "front ends", ha="center", fontsize=10, weight="bold")
    for y in (4.8, 3.4):
        _arrow(ax, (1.4, 3.5), (2.0, y))
    # Column 2: model management and the repository.
    _box(ax, 4.5, 3.6, 2.1, 1.7, "model management\nload / unload, versions,\nreadiness, config", "#fdd0a2")
    _box(ax, 4.5, 1.5, 2.1, 1.5, "model repository\nmodel/config.pbtxt\nmodel/1/model.*", "#fee6ce")
    ax.text(5.55, 5.6, "core", ha="center", fontsize=10, weight="bold")
    _arrow(ax, (5.55, 3.0), (5.55, 3.6), style="<|-|>")
    for y in (4.8, 3.4, 2.0):
        _arrow(ax, (3.9, y), (4.5, 4.4))
    # Column 3: schedulers, one per model.
    ax.text(8.0, 6.55, "per-model schedulers", ha="center", fontsize=10, weight="bold")
    for y in _column(ax, 7.1, 1.9, "scheduler", SCHEDULERS, placement, "#c7e9c0"):
        _arrow(ax, (6.6, 4.45), (7.1, y + 0.6))
    # Column 4: backends.
    ax.text(10.6, 6.55, "backends", ha="center", fontsize=10, weight="bold")
    _column(ax, 9.6, 2.0, "backend", BACKENDS, placement, "#dadaeb")
    for i in range(3):
        _arrow(ax, (9.0, 5.8 - i * 1.45), (9.6, 5.8 - i * 1.45))
    # The ensemble scheduler runs no backend: it feeds its steps to other models' schedulers.
    ax.text(8.05, 0.6, "ensemble steps re-enter other models' schedulers", ha="center", fontsize=7,
            color="#238b45")
    # The response goes back to the client.
    _box(ax, 11.9, 2.9, 1.0, 1.2, "response", "#eeeeee")
    _arrow(ax, (11.6, 3.5), (11.9, 3.5))
    _arrow(ax, (12.4, 2.9), (12.4, 0.3), color="#888888", style="-")
    _arrow(ax, (12.4, 0.3), (0.75, 0.3), color="#888888", style="-")
    _arrow(ax, (0.75, 0.3), (0.75, 2.9), color="#888888")
    ax.text(4.0, 0.4, "the response returns through the same front end", ha="center", fontsize=8, color="#555555")
    ax.set_title(title or "Triton Inference Server: the path of one request", fontsize=12)
    return ax


def _column(ax: Any, x: float, width: float, kind: str, names: Sequence[str],
            placement: Mapping[tuple[str, str], list[str]], color: str) -> list[float]:
    """One box per scheduler (or backend) kind, top to bottom, naming the models placed there;
    returns the boxes' bottom edges so that the caller can draw arrows to them."""
    ys = []
    for i, name in enumerate(names):
        y = 5.2 - i * 1.45
        models = placement.get((kind, name), [])
        label = name + ("\n" + _names(models) if models else "")
        _box(ax, x, y, width, 1.2, label, color, size=7 if models else 9)
        ys.append(y)
    return ys


def _names(models: list[str], limit: int = 3) -> str:
    shown = "\n".join(models[:limit])
    return shown + (f"\n+{len(models) - limit} more" if len(models) > limit else "")


def model_placement(configs: Mapping[str, Any]) -> dict[tuple[str, str], list[str]]:
    """``{("scheduler", name): [models], ("backend", name): [models]}`` for the given configs."""
    placement: dict[tuple[str, str], list[str]] = {}
    for model in sorted(configs):
        config = configs[model]
        placement.setdefault(("scheduler", scheduler_of(config)), []).append(model)
        placement.setdefault(("backend", backend_of(config)), []).append(model)
    return placement


def placement_table(configs: Mapping[str, Any]):
    """One row per model: its scheduler, backend, max_batch_size and instance count (a DataFrame)."""
    rows = []
    for model in sorted(configs):
        config = configs[model]
        rows.append({
            "model": model,
            "scheduler": scheduler_of(config),
            "backend": backend_of(config),
            "max_batch_size": config.max_batch_size,
            "instances": sum(g.count or 1 for g in config.instance_group) or 1,
        })
    return pd.DataFrame(rows).set_index("model") if rows else pd.DataFrame(
        columns=["scheduler", "backend", "max_batch_size", "instances"])
