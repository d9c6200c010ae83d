"""Notebook 09d: bringing up a framework Triton has no backend for (ExecuTorch), end to end.

What the lesson reads and measures, one function each:

* :data:`NEEDS` and :func:`needs`: what Triton needs from ANY runtime (load, check, memory, inputs,
  execute, outputs, errors, threads), where ExecuTorch's headers (in the executorch wheel of the build
  environment) give it, and where our backend calls it. :func:`needs` checks that each named declaration
  is really in the named header of the installed wheel, so the table cannot drift from the runtime;
* :func:`show_declaration`: a header's lines around one declaration, to read beside our backend;
* :func:`refused_load`: a config that contradicts the program, loaded on the lesson's server, and the one
  line the load fails with;
* :func:`weigh` and :func:`speed`: the three ways to serve the same network (Python stub + PyTorch,
  lab_libtorch, lab_executorch) from :mod:`lab_backends.measure.new_framework_cost`, on one server;
  :func:`claims`: what the notebook asserts about them, checked with
  :func:`lab_backends.notebook.check_claims` (a miss re-measures once over a longer window).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import triton_to_np_dtype

from lab_backends.digits import executorch_env
from lab_backends.errors import LabBackendsError, ModelLoadError
from lab_backends.measure import new_framework_cost
from lab_backends.notebook import Claim, sized
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend, executorch_backend
from lab_backends.server.repository import read_config
from lab_backends.server.running import RunningServer

MODELS = new_framework_cost.MODELS
ET_MODEL = "digits_et"
#: (what Triton needs, the ExecuTorch declaration, its header under executorch/include/executorch/,
#: where lab_executorch does it).
NEEDS = [
    ("load the model file, once per instance", "static Result<Program> load(",
     "runtime/executor/program.h", "bind(): FileDataLoader::from, Program::load"),
    ("the model's own tensors, to check the config against", "Result<TensorInfo> input_tensor_meta(",
     "runtime/executor/method_meta.h", "bind(): each tensor against the config"),
    ("its memory, planned before the first request", "memory_planned_buffer_size(",
     "runtime/executor/method_meta.h", "bind(): one buffer per planned buffer"),
    ("a place for the runtime's own structures", "explicit MemoryManager(",
     "runtime/executor/memory_manager.h", "bind(): MemoryManager(method_allocator, planned, temp)"),
    ("a batch of inputs, any rows up to the bound", "Error set_input(",
     "runtime/executor/method.h", "run(): TensorImpl over b->input, set_input"),
    ("one run per batch", "Error execute();", "runtime/executor/method.h", "run(): execute"),
    ("the outputs, to scatter", "const EValue& get_output(", "runtime/executor/method.h", "run(): get_output(0)"),
    ("errors as values, never an exception across Triton", "enum class Error",
     "runtime/core/error.h", "every call: Error / Result<T>, turned into one line"),
    ("threads under the backend's control", "struct NoThreadPoolGuard",
     "extension/threadpool/threadpool_guard.h", "XNNPACK_THREADS \"1\": the guard around load and execute"),
]
#: Each window: a bounded number of requests or seconds, whichever ends first (doubled on a re-measure).
WINDOW = {"requests": sized(300, 150), "duration_s": sized(2.0, 1.0)}


def include_dir() -> Path:
    """ExecuTorch's headers in the installed wheel, or a clear error saying how to get them."""
    root = executorch_env.runtime_root() / "include" / "executorch"
    if not root.is_dir():
        raise LabBackendsError(f"no ExecuTorch headers at {root}: run `lab-backends setup` (it makes the "
                               f"ExecuTorch build environment {executorch_env.VENV_DIR} and builds lab_executorch)")
    return root


def ready() -> Path:
    """The built backend and the placed program, or a clear error: set-up makes both."""
    library = cbackend.library_path(executorch_backend.NAME)
    missing = [str(p) for p in (library, executorch_env.PLACED) if not p.is_file()]
    if missing:
        raise LabBackendsError(f"{', '.join(missing)} missing: run `lab-backends setup` (LAB_SKIP_EXECUTORCH "
                               "must be unset): it exports digits_et and builds lab_executorch")
    return library


def needs() -> pd.DataFrame:
    """:data:`NEEDS` as a table, each declaration found in its header (``found``: the header's line)."""
    rows = []
    for need, declaration, header, ours in NEEDS:
        text = (include_dir() / header).read_text().splitlines()
        line = next((i + 1 for i, t in enumerate(text) if declaration in t), 0)
        rows.append({"Triton needs": need, "ExecuTorch gives": declaration.rstrip("(;").strip(),
                     "header": f"{header}:{line}" if line else f"{header}: NOT FOUND", "lab_executorch": ours,
                     "found": line > 0})
    return pd.DataFrame(rows)


def show_declaration(header: str, declaration: str, before: int = 6, after: int = 3) -> str:
    """Print a header's lines around ``declaration`` (its doc comment usually sits just above); the text."""
    lines = (include_dir() / header).read_text().splitlines()
    at = next((i for i, t in enumerate(lines) if declaration in t), None)
    if at is None:
        raise LabBackendsError(f"{header} declares no {declaration!r} in this ExecuTorch")
    start = max(0, at - before)
    shown = lines[start:at + after + 1]
    print(f"{header}:{start + 1}-{start + len(shown)}")
    for number, line in enumerate(shown, start + 1):
        print(f"{number:4d}  {line}")
    return "\n".join(shown)


@dataclass(frozen=True)
class BoundLine:
    """The line an instance of lab_executorch logs once its program is bound, read back."""

    text: str
    buffers: int
    planned_bytes: int
    batch_bound: int


def bound_line(server: RunningServer, instance: str = f"{ET_MODEL}_0_0") -> BoundLine:
    """``instance``'s 'bound in' line from ``server``'s log (planned buffers, their bytes, the batch bound)."""
    line = next((t for t in server.log_text().splitlines() if f"instance '{instance}'" in t and " bound in " in t), "")
    found = re.search(r"(\d+) planned buffer\(s\) of (\d+) bytes, batch bound (\d+)", line)
    if found is None:
        raise LabBackendsError(f"the server's log has no 'bound in' line of lab_executorch for instance {instance!r}: "
                               f"load {ET_MODEL} on this server first")
    return BoundLine(line[line.index("lab_executorch: "):].rstrip('"'), int(found[1]), int(found[2]), int(found[3]))


def io_bytes() -> int:
    """Bytes of digits_et's input and output at the program's batch bound, from its config's types and dims."""
    config = read_config(MODEL_REPOSITORY / ET_MODEL)
    row = sum(np.dtype(triton_to_np_dtype(model_config_pb2.DataType.Name(t.data_type)[len("TYPE_"):])).itemsize
              * math.prod(t.dims) for t in (*config.input, *config.output))
    return executorch_env.MAX_BATCH * row


def refused_load(server: RunningServer, change: str = "dims") -> str:
    """A copy of digits_et's config whose input ``dims`` (or ``dtype``, or ``max_batch``) contradicts the
    program, loaded on ``server`` through the repository API; the one line it fails with."""
    config = read_config(MODEL_REPOSITORY / ET_MODEL)
    config.name = f"et_wrong_{change}"
    if change == "dims":
        config.input[0].dims[:] = [63]
    elif change == "max_batch":
        config.max_batch_size = 128
    else:
        raise LabBackendsError(f"change must be 'dims' or 'max_batch', not {change!r}")
    try:  # the program travels with the override: a model of the repository API, no folder written anywhere
        server.load_model(config.name, config=config, files={"file:1/model.pte": executorch_env.PLACED.read_bytes()})
    except ModelLoadError as exc:
        return next((line for line in exc.reason.splitlines() if "lab_executorch: " in line), exc.reason)
    raise LabBackendsError(f"{config.name} loaded although its config contradicts the program")


def weigh(server: RunningServer) -> pd.DataFrame:
    """Each model loaded alone on ``server`` (started with none): load time and memory added, beside what
    each way needs on disk; one row per model."""
    return new_framework_cost.weighed(server, MODELS).set_index("model")


def speed(server: RunningServer, factor: float = 1.0) -> pd.DataFrame:
    """p50 at one request in flight, throughput at 16; ``factor`` stretches the windows (a re-measure)."""
    frame = new_framework_cost.speed(server, MODELS, int(WINDOW["requests"] * factor), WINDOW["duration_s"] * factor)
    return frame.set_index("model")


def claims() -> list[Claim]:
    """Ratios of the same run: ExecuTorch in the server against PyTorch in a stub, at 16 in flight."""
    return [Claim("throughput at c=16, digits_et (lab_executorch) / digits_torch (Python stub)",
                  lambda m: m.loc[ET_MODEL, "throughput_rps_c16"] / m.loc["digits_torch", "throughput_rps_c16"],
                  above=1.0, what="ratio")]


def answer_lines(footprint: pd.DataFrame, measured: pd.DataFrame) -> list[str]:
    """The sentences the notebook prints, from this run's numbers."""
    out = []
    for served, model in MODELS.items():
        f, m = footprint.loc[model], measured.loc[model]
        out.append(f"{served:22s} {model:20s} load {f['load_s']:.2f} s, +{f['memory_added_mb']:.0f} MB in the "
                   f"server (and its stubs), {f['framework_libraries_mb']:.0f} MB of framework libraries, a "
                   f"{f['model_file_mb']:.1f} MB model file; p50 {m['p50_ms_c1']:.2f} ms at c=1, "
                   f"{m['throughput_rps_c16']:.0f} req/s at c=16")
    return out


def reason_names(line: str, *parts: str) -> bool:
    """Does the refusal ``line`` name every one of ``parts`` (the model, the tensor, the fix)?"""
    return "\n" not in line and all(p in line for p in parts)

