"""Record what a real tritonserver 2.51 said about inspected requests (run once; outputs are committed).

    PYTHONPATH=$PWD .venv/bin/python tests/data/inspector/record.py

Writes, beside this file: ``trace_records.json`` (the raw trace records of a burst of 6 to
digits_ensemble, digits_ensemble's 100 ms batcher making them share executions, plus one request
per protocol to digits_onnx), ``stats_before.json``/``stats_after.json`` (digits_ensemble around the
burst), ``wire.json`` (the bytes of the three protocols' exchanges) and ``meta.json`` (which ids).
``tests/test_inspector.py`` checks the inspector's pieces on them without a server.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    from lab_backends.client import protocol as wire
    from lab_backends.lessons.inspector import SEVEN, inspect, stroke
    from lab_backends.lessons.inspector.exchange import fit_input
    from lab_backends.measure import stats, trace
    from lab_backends.server.config_changes import apply_config
    from lab_backends.server.triton_server import TritonServer

    image = stroke(SEVEN)
    models = ["digits_preprocess", "digits_onnx", "digits_postprocess", "digits_ensemble"]
    trace_file = Path(tempfile.mkdtemp(prefix="record-inspector-")) / "trace.json"
    with TritonServer(
        models=models, trace_file=trace_file, trace_level=("TIMESTAMPS",), trace_rate=1, trace_log_frequency=1
    ) as server:
        for step in ("digits_preprocess", "digits_onnx", "digits_postprocess"):
            apply_config(server, step, {"dynamic_batching": {"max_queue_delay_microseconds": 100_000}})
        inspect(server, "digits_ensemble", image, "gRPC", request_id="warmup")
        before = stats.settled_statistics(server, "digits_ensemble")
        burst = inspect(server, "digits_ensemble", image, "REST binary", burst=6, request_id="burst")
        after = stats.settled_statistics(server, "digits_ensemble")
        fit = fit_input(server.model_config("digits_onnx"), image)
        ids = {}
        exchanges = {}
        for label, binary in (("json", False), ("binary", True)):
            ex = wire.http_exchange(
                server, "digits_onnx", {fit.name: fit.tensor}, binary=binary, request_id=f"one-{label}"
            )
            ids[label] = f"one-{label}"
            exchanges[label] = {
                "request_headers": ex.request_headers,
                "request_body": base64.b64encode(ex.request_body).decode(),
                "response_headers": ex.response_headers,
                "response_body": base64.b64encode(ex.response_body).decode(),
            }
        gx = wire.grpc_exchange(server, "digits_onnx", {fit.name: fit.tensor}, request_id="one-grpc")
        exchanges["grpc"] = {
            "request": base64.b64encode(gx.request.SerializeToString()).decode(),
            "response": base64.b64encode(gx.response.SerializeToString()).decode(),
        }
        wanted = {"burst", *burst.burst_ids, "one-json", "one-binary", "one-grpc"}
        trace.read_trace(trace_file, request_ids=wanted)
        records = trace.read_records(trace_file)
    log = trace.TraceLog.from_records(records)
    keep = set(log.select(wanted).requests["trace_id"].astype(int))
    (HERE / "trace_records.json").write_text(json.dumps([r for r in records if int(r["id"]) in keep], indent=1) + "\n")
    (HERE / "stats_before.json").write_text(json.dumps(before, indent=1) + "\n")
    (HERE / "stats_after.json").write_text(json.dumps(after, indent=1) + "\n")
    (HERE / "wire.json").write_text(json.dumps(exchanges, indent=1) + "\n")
    (HERE / "meta.json").write_text(
        json.dumps(
            {"burst": "burst", "copies": burst.burst_ids, "largest_batch": burst.batch_size, "image": image.tolist()},
            indent=1,
        )
        + "\n"
    )
    print(burst.summary())
    print(burst.executions)


if __name__ == "__main__":
    main()
