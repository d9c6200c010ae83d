"""What a backend costs: the same trivial operation served by the Python backend and by a C backend.

Both models compute ``OUTPUT0 = INPUT0 * 2`` on FP32 vectors, with the same config (max batch 64,
dynamic batching, one CPU instance), on ONE server, measured side by side in one run at 1 and 16
requests in flight. The operation costs nothing, so what differs is the backend itself:

* the C backend (``c_backends/scale/scale.c``) runs inside the server process, on the model
  instance's thread: Execute copies every request's input into one block (``lab_gather_input``,
  one ``memcpy`` per buffer), computes once, and copies each result into its response buffer;
* the Python backend (``libtriton_python.so``, itself a C backend) hands every batch to a stub
  process through shared memory and a message queue, where the interpreter (one GIL, one process
  per instance) runs ``execute``, then takes the responses back the same way.

The statistics API splits each request's server time into queue, compute input, compute infer and
compute output; the C backend reports its own timestamps, the Python backend includes the hand-off
in its compute times. ``lab-backends bench backends`` writes ``bench/backends.csv`` and
``bench/backends.png``; notebook 09 runs a small version and checks the direction only. The same
command then compares a real framework wrapped by the Python backend with the same framework served
natively (:mod:`lab_backends.measure.native_cost`: four rows, two ratios, ``bench/native_backends.csv``).

Deferred import: matplotlib (~1 s), only when the figure is drawn.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from tritonclient.grpc import model_config_pb2

from lab_backends.measure.loadgen import run_closed
from lab_backends.measure.native_cost import native_bench
from lab_backends.measure.native_cost import report as native_report
from lab_backends.measure.new_framework_cost import bench as new_framework_bench
from lab_backends.measure.new_framework_cost import report as new_framework_report
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server import cbackend
from lab_backends.server.repository import ModelConfig, config_text
from lab_backends.server.triton_server import TritonServer

MODELS = {"python": "double_py", "c": "double_c"}
CONCURRENCIES = (1, 16)
#: The Python model: one numpy multiply per batch, like scale.c's one loop per batch.
PY_SOURCE = '''"""OUTPUT0 = INPUT0 * 2 for every request of the batch (the Python twin of c_backends/scale)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * np.float32(2)).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


def _config(name: str, backend: str) -> Any:
    config = ModelConfig(name=name, backend=backend, max_batch_size=64)
    config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    config.output.add(name="OUTPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.dynamic_batching.SetInParent()  # delay 0: batch what queued while busy, never wait
    if backend == "scale":
        config.parameters["factor"].string_value = "2"
    return config


def prepare(root: str | Path) -> tuple[Path, Path]:
    """Write the two models into ``root/models`` and build scale.c into ``root/backends``."""
    root = Path(root)
    repo, backends = root / "models", root / "backends"
    cbackend.build(cbackend.C_BACKENDS_DIR / "scale" / "scale.c", "scale", backends)
    for kind, name in MODELS.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config_text(_config(name, "python" if kind == "python" else "scale")))
        if kind == "python":
            (repo / name / "1" / "model.py").write_text(PY_SOURCE)
    return repo, backends


def measure(server: Any, requests: int, duration_s: float, concurrencies=CONCURRENCIES,
            log: Callable[[str], None] = lambda message: None) -> pd.DataFrame:
    """One row per (backend, concurrency), the backends alternating at each concurrency."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    rows = []
    for c in concurrencies:
        for kind, model in MODELS.items():
            result = run_closed(server, model, c, inputs={"INPUT0": x}, requests=requests, duration_s=duration_s,
                                warmup_requests=max(20, 2 * c), warmup_s=1.0)
            s, w = result.summary, result.server
            row = {"backend": kind, "model": model, "concurrency": c, "throughput_rps": s["throughput_rps"],
                   "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "errors": s["errors"]}
            if w is not None:
                row.update(server_ms=w.server_ms, queue_ms=w.queue_ms, compute_input_ms=w.compute_input_ms,
                           compute_infer_ms=w.compute_infer_ms, compute_output_ms=w.compute_output_ms,
                           avg_batch=w.avg_batch)
            rows.append(row)
            log(f"{kind:6s} c={c:<3d} {s['throughput_rps']:8.0f} req/s  p50 {s['p50_ms']:.2f} ms")
    return pd.DataFrame(rows)


def figure(frame: pd.DataFrame) -> Any:
    """Throughput per backend and concurrency, and the server time per request split by stage."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    pivot = frame.pivot(index="concurrency", columns="backend", values="throughput_rps")
    pivot.plot.bar(ax=left, rot=0)
    left.set_ylabel("requests / s")
    left.set_title("throughput, same op, one instance")
    stages = ["queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms"]
    per = frame.set_index(["backend", "concurrency"])[stages] * 1000
    per.columns = [c.replace("_ms", "") for c in stages]
    per.plot.barh(stacked=True, ax=right)
    right.set_xlabel("server time per request (µs)")
    right.set_title("where the server time goes")
    fig.tight_layout()
    return fig


def backends_bench(out_dir: str | Path = PROJECT_ROOT / "bench", quick: bool = False,
                   log: Callable[[str], None] = print) -> pd.DataFrame:
    """Run the comparison on one fresh server; write ``backends.csv`` and ``backends.png``. Then the
    frameworks, Python-wrapped vs native, on another (``native_backends.csv``; the printed report); then the
    digits MLP served three ways, ExecuTorch included (``new_framework.csv``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    requests, duration_s = (400, 3.0) if quick else (3000, 10.0)
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        repo, backends = prepare(tmp)
        with TritonServer(repo, models=list(MODELS.values()), backend_dir=backends, target="local") as server:
            frame = measure(server, requests, duration_s, log=log)
    frame.to_csv(out_dir / "backends.csv", index=False, float_format="%.4g")
    figure(frame).savefig(out_dir / "backends.png", dpi=110)
    log(frame.to_string(index=False))
    native = native_bench(*((200, 2.0) if quick else (2000, 8.0)), log=log)
    native.to_csv(out_dir / "native_backends.csv", index=False, float_format="%.4g")
    log(native_report(native))
    three = new_framework_bench(*((200, 2.0) if quick else (2000, 8.0)), log=log)  # lesson 09d's three ways
    three.to_csv(out_dir / "new_framework.csv", index=False, float_format="%.4g")
    log(new_framework_report(three))
    return frame
