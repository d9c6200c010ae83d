"""Record the real trace files in ``tests/data/traces`` (run once; the files are committed).

    .venv/bin/python tests/record_traces.py

Each file comes from a real tritonserver 2.51 run; the unit tests in ``test_trace.py`` parse them
so that the parser is checked against what Triton really writes, without starting a server.
The burst only queues when its six requests reach the server within cost_model's 10 ms batch; on
a very busy machine they may not, and ``test_burst_shows_queued_and_unqueued_requests`` says so:
record again when the machine is quieter.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from trace_models import BLS, CACHED, ENSEMBLE, write_cached_model, write_trace_models  # noqa: E402

from lab_backends.client.infer import infer  # noqa: E402
from lab_backends.measure import trace as tracing  # noqa: E402
from lab_backends.paths import MODEL_REPOSITORY  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

OUT = HERE / "data" / "traces"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="record-traces-"))
    repo = write_cached_model(write_trace_models(work / "repo"), MODEL_REPOSITORY / "cost_model")
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    models = ["cost_model", ENSEMBLE, BLS, CACHED]

    # 1. log_frequency=0: one file, written at shutdown.
    trace = work / "all.json"
    with TritonServer([MODEL_REPOSITORY, repo], models=models, trace_file=trace, cache_size=1 << 20) as server:
        infer(server, "cost_model", {"INPUT0": x}, protocol="http", request_id="http-1")
        infer(server, "cost_model", {"INPUT0": x}, protocol="grpc", request_id="grpc-1")
        # Six at once: the first runs, the others wait in the dynamic batcher's queue.
        tracing.send_burst(server, "cost_model", {"INPUT0": np.ones((1, 16), np.float32)}, 6)
        infer(server, ENSEMBLE, {"INPUT0": x}, protocol="http", request_id="ensemble-1")
        infer(server, BLS, {"INPUT0": x}, protocol="grpc", request_id="bls-1")
        infer(server, CACHED, {"INPUT0": x}, protocol="http", request_id="cache-miss")
        infer(server, CACHED, {"INPUT0": x}, protocol="http", request_id="cache-hit")
    shutil.copy(trace, OUT / "all.json")

    # 2. log_frequency=1: one file per trace, F.0, F.1, ... written while the server runs.
    split = work / "split.json"
    with TritonServer(models=["cost_model"], trace_file=split, trace_log_frequency=1) as server:
        for protocol in ("http", "grpc", "http"):
            infer(server, "cost_model", {"INPUT0": x}, protocol=protocol, request_id=f"split-{protocol}")
    for part in sorted(work.glob("split.json.*")):
        shutil.copy(part, OUT / part.name)
    shutil.rmtree(work)
    print("recorded:", ", ".join(sorted(p.name for p in OUT.iterdir())))


if __name__ == "__main__":
    main()
