"""How Triton finds the backend of a model, shown on the real server (notebook 09, section 8).

For a model whose config says ``backend: "<name>"`` (or a ``platform`` that implies one), Triton
2.51 looks for the library ``libtriton_<name>.so`` - or the file the config's ``runtime`` field
names - in the model's version folder, then the model folder, then ``<backend dir>/<name>/``; a
``<backend dir>/<name>/model.py`` with no library makes ``<name>`` a *Python-based backend*, run
by ``libtriton_python.so``. With ``--log-verbose=1`` the server logs each library it opens
(``OpenLibraryHandle: <path>``), which is how these lessons read the answer from the log instead
of asserting what the documentation says.

The native framework backends (ONNX Runtime, PyTorch, TensorFlow, TensorRT) follow the same rule:
:data:`NATIVE` describes their model folders, built as protobuf configs; the embedded server has
none of their libraries, and its refusal names what is missing.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tritonclient.grpc import model_config_pb2

from lab_backends.errors import ModelLoadError
from lab_backends.server.cbackend import exported_symbols
from lab_backends.server.repository import ModelConfig, config_text, parse_config

_LOADING = re.compile(r'"loading: ([\w.-]+):\d+"')
_OPENED = re.compile(r'OpenLibraryHandle: ([^"]+)"')


def scale_config(name: str, backend: str = "scale", runtime: str = "", factor: str = "3") -> ModelConfig:
    """A model for the scale C backend under any backend name / runtime (protobuf, not a template)."""
    config = ModelConfig(name=name, backend=backend, runtime=runtime, max_batch_size=8)
    config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    config.parameters["factor"].string_value = factor
    return config


def write(repo: Path, config: ModelConfig, files: dict[str, Path | bytes] | None = None) -> Path:
    """``repo/<name>/config.pbtxt`` plus ``files`` (relative path -> source file or bytes)."""
    folder = Path(repo) / config.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config_text(config))
    for relative, content in (files or {}).items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            shutil.copy(content, target)
    return folder


def opened_libraries(log: str) -> dict[str, list[str]]:
    """Model -> the shared libraries the server opened while loading it (needs ``log_verbose=1``)."""
    opened: dict[str, list[str]] = {}
    current = None
    for line in log.splitlines():
        loading = _LOADING.search(line)
        if loading:
            current = loading.group(1)
            continue
        hit = _OPENED.search(line)
        if hit and current:
            opened.setdefault(current, []).append(hit.group(1))
    return opened


def entry_points(libraries: dict[str, Path]) -> pd.DataFrame:
    """Which ``TRITONBACKEND_*`` functions each library exports (rows: functions, columns: libraries)."""
    exported = {
        label: {s for s in exported_symbols(path) if s.startswith("TRITONBACKEND_")}
        for label, path in libraries.items()
    }
    names = sorted(set().union(*exported.values()))
    return pd.DataFrame(
        {label: ["✓" if n in found else "" for n in names] for label, found in exported.items()},
        index=pd.Index(names, name="entry point"),
    )


@dataclass(frozen=True)
class Native:
    """One native framework model folder: what Triton needs to serve it."""

    platform: str
    backend: str
    model_file: str
    needs: str


NATIVE = (
    Native(
        "onnxruntime_onnx",
        "onnxruntime",
        "1/model.onnx",
        "libtriton_onnxruntime.so + ONNX Runtime libraries; CPU or GPU; "
        "the config can be auto-completed from the model",
    ),
    Native(
        "pytorch_libtorch",
        "pytorch",
        "1/model.pt",
        "libtriton_pytorch.so + libtorch; a TorchScript file (torch.jit.save), "
        "tensors named INPUT__0 / OUTPUT__0 or by name",
    ),
    Native(
        "tensorflow_savedmodel",
        "tensorflow",
        "1/model.savedmodel/saved_model.pb",
        "libtriton_tensorflow.so + TensorFlow libraries; a SavedModel folder (saved_model.pb + variables/)",
    ),
    Native(
        "tensorrt_plan",
        "tensorrt",
        "1/model.plan",
        "libtriton_tensorrt.so + TensorRT + an NVIDIA GPU of the kind the plan was built for (plans are not portable)",
    ),
)


def native_config(native: Native, name: str | None = None) -> ModelConfig:
    """A minimal config for one native kind (the digits MLP's tensors), through Triton's protobuf."""
    config = ModelConfig(name=name or f"native_{native.backend}", platform=native.platform, max_batch_size=64)
    config.input.add(name="PIXELS", data_type=model_config_pb2.TYPE_FP32, dims=[64])
    config.output.add(name="LOGITS", data_type=model_config_pb2.TYPE_FP32, dims=[10])
    return config


def native_gallery() -> pd.DataFrame:
    """The four native kinds: folder layout, platform/backend, what each needs, and a config that
    Triton's own protobuf parses back to the same message (``validated``)."""
    rows = []
    for native in NATIVE:
        config = native_config(native)
        text = config_text(config)
        rows.append(
            {
                "platform": native.platform,
                "backend": native.backend,
                "layout": f"{config.name}/config.pbtxt, {config.name}/{native.model_file}",
                "needs": native.needs,
                "validated": parse_config(text, config.name) == config,
                "config.pbtxt": text,
            }
        )
    return pd.DataFrame(rows).set_index("platform")


def write_natives(repo: Path) -> list[str]:
    """Each native model folder with a placeholder model file (the load fails before reading it)."""
    names = []
    for native in NATIVE:
        config = native_config(native)
        write(repo, config, {native.model_file: b""})
        names.append(config.name)
    return names


def load_refusals(server: Any, names: list[str]) -> dict[str, str]:
    """Model -> the reason Triton's log gives for refusing to load it (empty if it loaded)."""
    reasons = {}
    for name in names:
        before = len(server.log_text())
        try:
            server.load_model(name)
            reasons[name] = ""
        except ModelLoadError:
            lines = [ln for ln in server.log_text()[before:].splitlines() if f"failed to load '{name}' version" in ln]
            reasons[name] = lines[-1].split(": ", 1)[-1].rstrip('"') if lines else "(no reason in the log)"
    return reasons
