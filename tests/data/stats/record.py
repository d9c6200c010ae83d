"""Re-record the statistics fixtures used by tests/test_stats.py from a real server.

    .venv/bin/python tests/data/stats/record.py

Runs one closed-loop window on ``cost_model`` (dynamic batching, 8 in flight) and saves the
statistics payloads (HTTP JSON, and the gRPC message as JSON, whose counters are strings) and the
Prometheus pages taken right before and after it, with what the client counted in ``window.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from lab_backends.measure.loadgen import run_closed  # noqa: E402
from lab_backends.server.config_changes import apply_config  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

MODEL = "cost_model"


def main() -> None:
    with TritonServer(models=[MODEL]) as server:
        apply_config(server, MODEL, {"dynamic_batching": {"max_queue_delay_microseconds": 3000}})
        run_closed(server, MODEL, 8, requests=40, server_stats=False)  # some history before the window
        result = run_closed(server, MODEL, 8, requests=200, duration_s=20, warmup_requests=0, metrics=True)
        before_text, after_text = result.metrics_text
        # The same counters once more, as the gRPC API returns them (uint64 as JSON strings).
        grpc_json = server.grpc_client.get_inference_statistics(MODEL, headers=server.grpc_admin_headers, as_json=True)
    (HERE / "stats_before.json").write_text(json.dumps(result.stats_payloads[0], indent=1))
    (HERE / "stats_after.json").write_text(json.dumps(result.stats_payloads[1], indent=1))
    (HERE / "metrics_before.txt").write_text(before_text)
    (HERE / "metrics_after.txt").write_text(after_text)
    (HERE / "stats_grpc.json").write_text(json.dumps(grpc_json, indent=1))
    (HERE / "window.json").write_text(json.dumps({
        "client_requests": result.summary["requests"],
        "client_ok": result.summary["ok"],
        "server_requests": result.server.requests,
        "executions": result.server.executions,
        "batch_hist": {str(k): v for k, v in result.server.batch_hist.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
