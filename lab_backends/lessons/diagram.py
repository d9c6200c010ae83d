"""The serving architecture of Triton as one matplotlib figure, optionally with *your* models on it.

Left to right, the path of one request: the front ends (HTTP/REST, gRPC) hand it to the model
manager, which knows the repository; each model has its own scheduler (default, dynamic batcher,
sequence batcher or ensemble), and the scheduler hands batches to a backend (python, a C backend,
or a framework backend such as ONNX Runtime or PyTorch in the NGC image). The response travels the
same way back. Passing the server's model configs places each model under the scheduler and the
backend its config picks, and draws one arrow per scheduler -> backend pair that a model really
uses, so the picture matches the server that is running (no arrow joins boxes merely because they
sit side by side).

Which backend *runs* a model is not always the name in its config: a ``backend: "sklearn"`` whose
backend folder holds a ``model.py`` and no ``libtriton_sklearn.so`` is a Python-based backend, run
by ``libtriton_python.so`` (core ``src/backend_model.cc`` L387-415 at r24.10: the C++ library is
tried first, then ``<backend dir>/<name>/model.py``), and the server records that in the live
config as ``runtime: "model.py"`` (same file, L313-323). :func:`backend_of` reads that field, or
the backend directory for a config read from disk.

Deferred import: matplotlib (~1 s), only when the diagram is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
from google.protobuf.json_format import MessageToDict

from lab_backends.paths import BACKEND_DIR

#: Scheduler names as this workbench shows them, in the order they are drawn.
SCHEDULERS = ("default", "dynamic batcher", "sequence batcher", "ensemble")
#: Backend boxes: what runs here, and what only the NGC image (GPU stack) brings.
BACKENDS = ("python", "C (custom)", "onnxruntime (NGC)", "pytorch (NGC)", "tensorflow (NGC)")
#: What an ensemble's backend column says: it has no backend of its own.
NO_BACKEND = "(none: steps run in other models)"

#: Framework backends by the name in ``backend`` or ``platform`` (core ``src/model_config_utils.cc``
#: ``GetBackendTypeFromPlatform``, L2307-2328 at r24.10, maps the platforms to these backends).
_FRAMEWORKS = {
    "onnxruntime": "onnxruntime (NGC)", "onnxruntime_onnx": "onnxruntime (NGC)",
    "pytorch": "pytorch (NGC)", "pytorch_libtorch": "pytorch (NGC)",
    "tensorflow": "tensorflow (NGC)", "tensorflow_savedmodel": "tensorflow (NGC)",
    "tensorflow_graphdef": "tensorflow (NGC)",
}
#: The file that makes a backend folder a Python-based backend (core ``kPythonFilename``).
PYTHON_BASED_RUNTIME = "model.py"

# Layout (data coordinates of a 13 x 7 canvas).
_SCHED_X, _SCHED_W, _SCHED_H, _SCHED_TOP, _SCHED_STEP = 7.0, 1.8, 1.2, 5.2, 1.45
_BACK_X, _BACK_W, _BACK_H, _BACK_TOP, _BACK_STEP = 9.7, 1.9, 0.95, 5.45, 1.15
_RESPONSE_X = 11.95


def scheduler_of(config: Any) -> str:
    """Which scheduler Triton gives a model, from its ``ModelConfig``.

    Core ``src/backend_model.cc`` ``SetConfiguredScheduler`` (L821-847 at r24.10): sequence
    batching wins over dynamic batching; without either, the default scheduler is the dynamic
    batch scheduler with batching turned off. Ensembles get the ensemble scheduler
    (``src/ensemble_scheduler/ensemble_model.cc`` L51-54).
    """
    if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
        return "ensemble"
    if config.HasField("sequence_batching"):
        return "sequence batcher"
    if config.HasField("dynamic_batching"):
        return "dynamic batcher"
    return "default"


def is_python_based(config: Any, backend_dir: Path | None = BACKEND_DIR) -> bool:
    """Whether ``config`` names a Python-based backend (run by the Python backend's library).

    The live config says so itself (``runtime: "model.py"``); a config read from disk does not,
    so the server's ``backend_dir`` (this workbench's by default; ``None`` trusts the config
    alone) is read: a ``<name>/model.py`` there without ``<name>/libtriton_<name>.so`` is what the
    server would pick (a library in the model's own folder is not looked for here).
    """
    if config.runtime:
        return config.runtime == PYTHON_BASED_RUNTIME
    name = config.backend
    if not name or name == "python" or backend_dir is None:
        return False
    folder = Path(backend_dir) / name
    return (folder / PYTHON_BASED_RUNTIME).is_file() and not (folder / f"libtriton_{name}.so").is_file()


def backend_of(config: Any, backend_dir: Path | None = BACKEND_DIR) -> str:
    """The backend box of the backend that really runs the model (ensembles run none of their own)."""
    name = config.backend or config.platform
    if name == "ensemble":
        return NO_BACKEND
    if name == "python" or is_python_based(config, backend_dir):
        return "python"
    if name in _FRAMEWORKS:
        return _FRAMEWORKS[name]
    return "C (custom)" if name else "unknown"


def links(configs: Mapping[str, Any], backend_dir: Path | None = BACKEND_DIR) -> list[tuple[str, str]]:
    """The scheduler -> backend pairs that the given models use (ensembles have none), sorted."""
    pairs = {(scheduler_of(c), backend_of(c, backend_dir)) for c in configs.values()}
    return sorted(p for p in pairs if p[1] in BACKENDS)


def _box(ax: Any, x: float, y: float, w: float, h: float, text: str, color: str, size: int = 9,
         weight: str = "normal") -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#333333", linewidth=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight, wrap=True)


def _arrow(ax: Any, start: tuple[float, float], end: tuple[float, float], color: str = "#333333",
           style: str = "-|>", gid: str | None = None) -> None:
    from matplotlib.patches import FancyArrowPatch

    arrow = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, linewidth=1.2)
    arrow.set_gid(gid)
    ax.add_patch(arrow)


def drawn_links(ax: Any) -> set[str]:
    """The scheduler -> backend arrows a drawn diagram holds, read back from the figure itself."""
    return {patch.get_gid() for patch in ax.patches if patch.get_gid()}


def _middle(kind: str, name: str) -> float:
    """The vertical middle of a scheduler or backend box."""
    if kind == "scheduler":
        return _SCHED_TOP - SCHEDULERS.index(name) * _SCHED_STEP + _SCHED_H / 2
    return _BACK_TOP - BACKENDS.index(name) * _BACK_STEP + _BACK_H / 2


def architecture_diagram(configs: Mapping[str, Any] | None = None, ax: Any = None, title: str | None = None,
                         backend_dir: Path | None = BACKEND_DIR):
    """Draw the architecture; with ``configs`` (name -> ``ModelConfig``) list each model in its boxes.

    Each scheduler -> backend arrow is a pair some model uses (its gid reads ``"<scheduler> ->
    <backend>"``); the bare map draws none. Returns the matplotlib Axes. Use
    :func:`placement_table` for the same information as a table.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(13, 6.2))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 7)
    ax.axis("off")
    configs = configs or {}
    placement = model_placement(configs, backend_dir)

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
    ax.text(_SCHED_X + _SCHED_W / 2, 6.55, "per-model schedulers", ha="center", fontsize=10, weight="bold")
    _column(ax, "scheduler", SCHEDULERS, placement, "#c7e9c0")
    for name in SCHEDULERS:
        _arrow(ax, (6.6, 4.45), (_SCHED_X, _middle("scheduler", name)))
    # Column 4: backends, joined to the schedulers only where a model goes that way.
    ax.text(_BACK_X + _BACK_W / 2, 6.55, "backends", ha="center", fontsize=10, weight="bold")
    _column(ax, "backend", BACKENDS, placement, "#dadaeb")
    used = links(configs, backend_dir)
    for scheduler, backend in used:
        _arrow(ax, (_SCHED_X + _SCHED_W, _middle("scheduler", scheduler)), (_BACK_X, _middle("backend", backend)),
               gid=f"{scheduler} -> {backend}")
    note = "arrows: the pairs these models use" if used else "any scheduler may feed any backend"
    ax.text(_BACK_X + _BACK_W / 2, 0.55, note, ha="center", va="center", fontsize=7, color="#54278f")
    # The ensemble scheduler runs no backend: it feeds its steps to other models' schedulers.
    ax.text(_SCHED_X + _SCHED_W / 2, 0.55, "ensemble steps re-enter other models' schedulers", ha="center",
            va="center", fontsize=6.5, color="#238b45")
    # The response goes back to the client, from whichever backend ran the model.
    _box(ax, _RESPONSE_X, 2.9, 0.95, 1.2, "response", "#eeeeee")
    for backend in sorted({b for _, b in used}) or BACKENDS:
        _arrow(ax, (_BACK_X + _BACK_W, _middle("backend", backend)), (_RESPONSE_X, 3.5), color="#888888")
    _arrow(ax, (12.4, 2.9), (12.4, 0.2), color="#888888", style="-")
    _arrow(ax, (12.4, 0.2), (0.75, 0.2), color="#888888", style="-")
    _arrow(ax, (0.75, 0.2), (0.75, 2.9), color="#888888")
    ax.text(4.0, 0.3, "the response returns through the same front end", ha="center", fontsize=8, color="#555555")
    ax.set_title(title or "Triton Inference Server: the path of one request", fontsize=12)
    return ax


def _column(ax: Any, kind: str, names: Sequence[str], placement: Mapping[tuple[str, str], list[str]],
            color: str) -> None:
    """One box per scheduler (or backend) kind, top to bottom, naming the models placed there."""
    x, width, height = (_SCHED_X, _SCHED_W, _SCHED_H) if kind == "scheduler" else (_BACK_X, _BACK_W, _BACK_H)
    for name in names:
        y = _middle(kind, name) - height / 2
        models = placement.get((kind, name), [])
        label = name + ("\n" + _names(models) if models else "")
        _box(ax, x, y, width, height, label, color, size=7 if models else 9)


def _names(models: list[str], limit: int = 3) -> str:
    shown = "\n".join(models[:limit])
    return shown + (f"\n+{len(models) - limit} more" if len(models) > limit else "")


def model_placement(configs: Mapping[str, Any],
                    backend_dir: Path | None = BACKEND_DIR) -> dict[tuple[str, str], list[str]]:
    """``{("scheduler", name): [models], ("backend", name): [models]}`` for the given configs."""
    placement: dict[tuple[str, str], list[str]] = {}
    for model in sorted(configs):
        config = configs[model]
        placement.setdefault(("scheduler", scheduler_of(config)), []).append(model)
        placement.setdefault(("backend", backend_of(config, backend_dir)), []).append(model)
    return placement


def placement_table(configs: Mapping[str, Any], backend_dir: Path | None = BACKEND_DIR):
    """One row per model: its scheduler, the backend that runs it, the backend its config names,
    max_batch_size and instance count (a DataFrame)."""
    columns = ["scheduler", "backend", "config names", "max_batch_size", "instances"]
    rows = []
    for model in sorted(configs):
        config = configs[model]
        rows.append({
            "model": model,
            "scheduler": scheduler_of(config),
            "backend": backend_of(config, backend_dir),
            "config names": config.backend or config.platform,
            "max_batch_size": config.max_batch_size,
            "instances": sum(g.count or 1 for g in config.instance_group) or 1,
        })
    return pd.DataFrame(rows).set_index("model") if rows else pd.DataFrame(columns=columns)


def _leaves(message: Any) -> dict[str, Any]:
    """A config's set fields as ``{"dynamic_batching.preferred_batch_size": [64], ...}``."""
    def walk(value: Any, prefix: str) -> dict[str, Any]:
        if isinstance(value, dict) and value:
            return {k: v for key, sub in value.items()
                    for k, v in walk(sub, f"{prefix}.{key}" if prefix else key).items()}
        return {prefix: value}
    return walk(MessageToDict(message, preserving_proto_field_name=True), "")


def filled_by_server(on_disk: Any, live: Any) -> dict[str, Any]:
    """Fields whose value in the live config (``server.model_config``) is not what the file says:
    what the server filled in or normalized (core ``src/model_config_utils.cc`` ``NormalizeModelConfig``,
    e.g. L734-744 at r24.10: an empty ``preferred_batch_size`` becomes ``[max_batch_size]``)."""
    disk, used = _leaves(on_disk), _leaves(live)
    return {name: value for name, value in sorted(used.items()) if disk.get(name) != value}
