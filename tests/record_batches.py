"""Record the runs in ``tests/data/batches`` (run once; the files are committed).

    .venv/bin/python tests/record_batches.py

A real tritonserver 2.51 serves ``scheduler_probe`` with 2, then 3 instances, 120 requests each
with 12 in flight; the trace records of those requests and the probe's answers are saved, so that
``test_batches.py`` checks the batch grouping against what Triton really writes, without a server.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from lab_backends.lessons import scheduler  # noqa: E402
from lab_backends.measure import trace as tracing  # noqa: E402
from lab_backends.measure.probe_load import probe_load  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

OUT = HERE / "data" / "batches"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    trace = Path(tempfile.mkdtemp(prefix="record-batches-")) / "trace.json"
    with TritonServer(models=[scheduler.MODEL], trace_file=trace, trace_log_frequency=1) as server:
        shipped = server.model_config(scheduler.MODEL)
        for count in (2, 3):
            scheduler.reload(server, {"instance_group": [{"kind": "KIND_CPU", "count": count}]}, shipped)
            answers = probe_load(server, scheduler.MODEL, 120, concurrency=12, prefix=f"i{count}")
            ids = set(answers["request_id"])
            tracing.read_trace(trace, request_ids=ids, timeout_s=30)
            records = tracing.read_records(trace)
            keep = {r["id"] for r in records if r.get("request_id") in ids}
            (OUT / f"trace_{count}_instances.json").write_text(json.dumps([r for r in records if r["id"] in keep]))
            answers.to_csv(OUT / f"answers_{count}_instances.csv", index=False)
    print("recorded:", ", ".join(sorted(p.name for p in OUT.iterdir())))


if __name__ == "__main__":
    main()
