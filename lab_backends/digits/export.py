"""Export the trained MLP twice: TorchScript (for ``digits_torch`` and libtorch) and ONNX.

Both keep the batch dimension dynamic so that Triton's dynamic batcher can hand the model any
batch size up to ``max_batch_size``. ONNX tensor names are the interface names (``PIXELS`` ->
``LOGITS``), so the native ``onnxruntime_onnx`` config in ``model_repository_gpu`` maps 1:1.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import torch

from .net import INPUT_SIZE

ONNX_OPSET = 18
INPUT_NAME = "PIXELS"
OUTPUT_NAME = "LOGITS"


def export_torchscript(model: torch.nn.Module, path: Path) -> Path:
    """Trace to TorchScript: the only format Triton's ``pytorch_libtorch`` backend loads."""
    model.eval()
    with warnings.catch_warnings():
        # torch 2.13 marks torch.jit as deprecated in favour of torch.export, but Triton's
        # libtorch backend still loads TorchScript only.
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, torch.zeros(2, INPUT_SIZE))
        _atomic_save(path, lambda tmp: torch.jit.save(traced, str(tmp)))
    return path


def export_onnx(model: torch.nn.Module, path: Path, opset: int = ONNX_OPSET) -> Path:
    """Export to ONNX with a dynamic batch axis and the interface tensor names."""
    model.eval()
    batch = torch.export.Dim("batch", min=1, max=4096)

    def _write(tmp: Path) -> None:
        registration = logging.getLogger("torch.onnx._internal.exporter._registration")
        level = registration.level
        registration.setLevel(logging.ERROR)  # "torchvision is not installed": irrelevant here
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    model,
                    (torch.zeros(2, INPUT_SIZE),),
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    opset_version=opset,
                    dynamic_shapes=({0: batch},),
                    dynamo=True,
                    verbose=False,
                )
        finally:
            registration.setLevel(level)
        program.save(str(tmp))

    _atomic_save(path, _write)
    return path


def _atomic_save(path: Path, write) -> None:
    """Write to a temporary name, then rename: a server loading the model never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
