"""Export the digits MLP to ExecuTorch (``digits_et``): run as a script by the ExecuTorch venv's Python.

Never imported by the project: ExecuTorch's export needs numpy >= 2 and torchao 0.18, the project's venv
keeps numpy < 2 (Triton 2.51's Python stub corrupts inputs with numpy 2, docs/platform-notes), so this
file runs in ``build/executorch-venv`` (:mod:`lab_backends.digits.executorch_env` makes it), with
the project venv's torch found through a ``.pth`` line placed *after* the venv's own packages.

It reads the weights the project already trained from ``model.pt`` (the TorchScript file that
``digits_torch`` serves), rebuilds the same ``Linear``/``ReLU`` stack as a plain ``nn.Module``
(``torch.export`` cannot trace a TorchScript module), exports it with a dynamic batch dimension
1..MAX_BATCH, lowers every layer to XNNPACK (``to_edge_transform_and_lower`` with the XNNPACK
partitioner) and writes the ``.pte`` program. Before writing, it runs the program in ExecuTorch's
own Python runtime at a few batch sizes and compares with the TorchScript file: a wrong export
never reaches the model folder.

Usage: ``python export_et.py MODEL_PT OUT_PTE MAX_BATCH``; prints one JSON line (seconds, bytes,
delegated backends, the largest difference seen).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

#: Rows the agreement check runs at: one, a few, the bound itself.
CHECK_BATCHES = (1, 5)


def rebuilt(scripted: torch.jit.ScriptModule) -> torch.nn.Module:
    """The TorchScript file's Linear layers in order (``layers.<i>.weight``/``bias``), ReLU between them."""
    state = scripted.state_dict()
    indices = sorted({int(key.split(".")[1]) for key in state if key.startswith("layers.") and key.endswith(".weight")})
    if not indices:
        raise SystemExit(f"no layers.<i>.weight in the TorchScript file's state ({sorted(state)[:4]} ...)")
    modules: list[torch.nn.Module] = []
    for position, index in enumerate(indices):
        weight, bias = state[f"layers.{index}.weight"], state[f"layers.{index}.bias"]
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        linear.load_state_dict({"weight": weight, "bias": bias})
        modules.append(linear)
        if position + 1 < len(indices):
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules).eval()


def export(model_pt: Path, out: Path, max_batch: int) -> dict:
    started = time.perf_counter()
    scripted = torch.jit.load(str(model_pt)).eval()
    module = rebuilt(scripted)
    width = module[0].in_features
    example = (torch.zeros(2, width),)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(module, example, dynamic_shapes=({0: batch},))
        program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    data = program.buffer
    runtime = Runtime.get()
    method = runtime.load_program(data).load_method("forward")
    worst = 0.0
    generator = torch.Generator().manual_seed(0)
    for rows in (*CHECK_BATCHES, max_batch):
        x = torch.rand(rows, width, generator=generator) * 2 - 1
        got = method.execute([x])[0]
        with torch.no_grad():
            want = scripted(x)
        worst = max(worst, float((got - want).abs().max()))
    if worst > 1e-4:
        raise SystemExit(f"the ExecuTorch program differs from {model_pt} by {worst:.3g} (> 1e-4); not written")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, out)  # a server loading the model never reads half a file
    delegated = sorted({d.id for plan in program.executorch_program.execution_plan for d in plan.delegates})
    return {"seconds": round(time.perf_counter() - started, 2), "bytes": len(data), "delegates": delegated,
            "max_abs_diff": worst, "max_batch": max_batch}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: export_et.py MODEL_PT OUT_PTE MAX_BATCH")
    print(json.dumps(export(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))))
