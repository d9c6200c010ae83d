"""Load generators side by side, and where one batch's cycle goes on ``cost_model``.

Two questions the batching bench must answer before its numbers can be trusted:

* **Is our generator the bottleneck?** :func:`compare_loadgens` runs our HTTP and gRPC generators,
  the stock ``tritonclient.grpc.aio`` client and ``wrk`` (a C client, Debian package) on the same
  model, config and concurrency. The tools take turns in short rounds (A B C D, A B C D, ...) and
  each reports its median round, so that a slow minute of this shared 2-core machine hits every
  tool alike instead of whichever ran then.
* **Where does the rest go?** With one instance and as many clients as the preferred batch, a
  closed loop runs one full batch at a time, and every batch's cycle is
  ``execution (the model's own cost + the Python backend's hand-off) + turnaround (responses out,
  new requests in, the batch forms again)``. :func:`batch_cycle` splits the measured cycle that way
  from the statistics API's window of the same round, so the bench prints how much of the gap to
  the model's ceiling no client can remove.
"""

from __future__ import annotations

import re
import shutil
import statistics as pystats
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

from lab_backends.errors import LoadSettingError
from lab_backends.measure import stats as _stats
from lab_backends.measure.loadgen import example_inputs, http_request_bytes, run_closed
from lab_backends.server.config_changes import apply_config
from lab_backends.server.repository import ModelConfig
from lab_backends.server.running import RunningServer

#: Tools compared: (name, protocol for run_closed, or None for wrk).
LOADGENS = (
    ("lab_backends.measure.loadgen http", "http"),
    ("wrk", None),
    ("lab_backends.measure.loadgen grpc", "grpc"),
    ("tritonclient.grpc.aio", "grpc-tritonclient"),
)
#: cost_model with no cost at all: then only the client and the server's per-request work remain.
FREE = {"parameters": {"fixed_ms": {"string_value": "0"}, "per_item_ms": {"string_value": "0"}}}
CYCLE_COLUMNS = ["tool", "concurrency", "throughput_rps", "of_ceiling", "avg_batch", "cycle_ms", "model_ms",
                 "backend_ms", "turnaround_ms", "server_bound"]


def run_wrk(server: RunningServer, model: str, inputs: dict, concurrency: int, duration_s: float, threads: int = 1,
            warmup_s: float = 1.0) -> float:
    """Requests/s that ``wrk`` reaches with the same binary-tensor request as our HTTP generator."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise LoadSettingError("wrk is not installed; `apt-get install -y wrk` (the Makefile's bench target does it)")
    message = http_request_bytes(server.http_url, model, inputs)
    head, body = message.split(b"\r\n\r\n", 1)
    header_len = re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1).decode()
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        body_file = Path(tmp) / "body.bin"
        body_file.write_bytes(body)
        script = Path(tmp) / "infer.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f'wrk.path = "/v2/models/{model}/infer"\n'
            'wrk.headers["Content-Type"] = "application/octet-stream"\n'
            f'wrk.headers["Inference-Header-Content-Length"] = "{header_len}"\n'
            f'local f = assert(io.open("{body_file}", "rb"))\n'
            "wrk.body = f:read(\"*all\")\n"
            "f:close()\n"
        )

        def command(seconds: float) -> list[str]:
            return [wrk, f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "30s",
                    "-s", str(script), f"http://{server.http_url}"]

        if warmup_s > 0:
            subprocess.run(command(warmup_s), check=False, capture_output=True, text=True, timeout=warmup_s + 60)
        done = subprocess.run(command(duration_s), check=False, capture_output=True, text=True, timeout=duration_s + 60)
    out = done.stdout + done.stderr
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if done.returncode != 0 or bad:
        raise LoadSettingError(f"wrk failed (exit {done.returncode}):\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match:
        raise LoadSettingError(f"could not read Requests/sec from wrk's output:\n{out}")
    return float(match.group(1))


def cost_parameters(config: ModelConfig) -> tuple[float, float]:
    """``(fixed_ms, per_item_ms)`` of a live cost_model config, with the model's own defaults."""

    def value(key: str, default: float) -> float:
        return float(config.parameters[key].string_value) if key in config.parameters else default

    return value("fixed_ms", 10.0), value("per_item_ms", 0.2)


def cost_model_ceiling(concurrency: float, fixed_ms: float = 10.0, per_item_ms: float = 0.2) -> float:
    """Requests/s when every execution is one full batch of ``concurrency`` back to back."""
    return concurrency / ((fixed_ms + concurrency * per_item_ms) / 1000.0)


def batch_cycle(window: _stats.ServerWindow, throughput_rps: float, concurrency: int,
                fixed_ms: float, per_item_ms: float) -> dict[str, float]:
    """Split one batch's cycle into the model's cost, the Python backend's hand-off and the turnaround.

    * ``cycle_ms``: time between two batch starts, ``avg_batch / throughput``;
    * ``model_ms``: what the model itself costs for that batch (``fixed + per_item * batch``);
    * ``backend_ms``: the rest of one execution as the statistics API times it (compute input +
      infer + output, minus ``model_ms``): the requests going to the stub and the responses
      coming back;
    * ``turnaround_ms``: the cycle minus the execution: responses through the front end to the
      clients, new requests back in, and the batch forming again (the queue);
    * ``of_ceiling``: throughput over the ceiling ``c / (fixed + c * per_item)``;
    * ``server_bound``: the fraction of that ceiling left if the turnaround took no time at all,
      ``model_ms / execution``: what the server alone allows, whatever the client.

    The split holds for full batches (``avg_batch`` close to ``concurrency``), which is what the
    bench's cost_model config produces: every request of a batch is charged the batch's compute
    times, so the per-request averages of the window are the per-execution ones.
    """
    if throughput_rps <= 0 or window.executions == 0:
        raise ValueError("a cycle needs a window with executions and a positive throughput")
    batch = window.avg_batch
    cycle = 1000.0 * batch / throughput_rps
    execution = window.compute_input_ms + window.compute_infer_ms + window.compute_output_ms
    model = fixed_ms + per_item_ms * batch
    ceiling = cost_model_ceiling(concurrency, fixed_ms, per_item_ms)
    return {
        "throughput_rps": throughput_rps,
        "of_ceiling": throughput_rps / ceiling,
        "avg_batch": batch,
        "cycle_ms": cycle,
        "model_ms": model,
        "backend_ms": execution - model,
        "turnaround_ms": cycle - execution,
        "server_bound": model / execution,
    }


def _one_round(server: RunningServer, model: str, protocol: str | None, inputs: dict, concurrency: int,
               seconds: float, warm: bool, window: bool) -> dict[str, Any]:
    """One tool (``protocol`` None: wrk) for ``seconds``: its throughput, client CPU and, with
    ``window``, the server's statistics over that time (None without)."""
    if protocol is None:
        before = _stats.settled_statistics(server, model) if window else None
        rps = run_wrk(server, model, inputs, concurrency, seconds, warmup_s=1.0 if warm else 0.0)
        # wrk's warm-up second falls inside this window too: same config, same full batches.
        seen = _stats.window(before, _stats.settled_statistics(server, model), model) if window else None
        return {"throughput_rps": rps, "client_cpu_us": float("nan"), "window": seen}
    result = run_closed(server, model, concurrency, protocol=protocol, inputs=inputs, requests=10**6,
                        duration_s=seconds, warmup_requests=None if warm else 0, server_stats=window)
    summary = result.summary
    return {"throughput_rps": summary["throughput_rps"], "client_cpu_us": summary["client_cpu_us_per_request"],
            "window": result.server, "errors": summary["errors"], "first_error": summary["first_error"]}


def compare_loadgens(
    server: RunningServer, model: str, override: Any, seconds: float, log: Callable[[str], None] = print,
    concurrency: int = 16, rounds: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every tool, ``seconds`` in all, in ``rounds`` interleaved turns, on the bench's config and then
    on the same config at zero cost (where the clients' own cost shows most).

    Returns ``(loadgen rows, cycle rows)``: one loadgen row per tool and config (its median round),
    one cycle row per tool on the costed config (:func:`batch_cycle` of that median round).
    """
    base = server.model_config(model)
    rows: list[dict[str, Any]] = []
    cycles: list[dict[str, Any]] = []
    tools = [t for t in LOADGENS if t[1] is not None or shutil.which("wrk")]
    if len(tools) < len(LOADGENS):
        log("wrk rows skipped: wrk is not installed (`apt-get install -y wrk`; `make bench` does it)")
    try:
        for label, extra in ((model, None), (f"{model}(fixed_ms=0,per_item_ms=0)", FREE)):
            config = apply_config(server, model, override, base)
            if extra is not None:
                apply_config(server, model, extra, config)
            live = server.model_config(model)
            inputs = example_inputs(live)
            log(f"load generators on {label}, {concurrency} in flight, {seconds:.0f} s each in {rounds} rounds...")
            runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool, _ in tools}
            for turn in range(rounds):
                for tool, protocol in tools:
                    runs[tool].append(_one_round(server, model, protocol, inputs, concurrency, seconds / rounds,
                                                 warm=turn == 0, window=extra is None))
            for tool, _ in tools:
                done = runs[tool]
                for r in done:
                    if r.get("errors"):
                        log(f"{tool}: {r['errors']} errors, first: {r['first_error']}")
                median = pystats.median_low([r["throughput_rps"] for r in done])
                pick = next(r for r in done if r["throughput_rps"] == median)
                rows.append({"tool": tool, "model": label, "concurrency": concurrency,
                             "throughput_rps": median, "client_cpu_us": pick["client_cpu_us"]})
                if pick["window"] is not None and pick["window"].executions:  # the costed config only
                    fixed_ms, per_item_ms = cost_parameters(live)
                    cycles.append({"tool": tool, "concurrency": concurrency,
                                   **batch_cycle(pick["window"], median, concurrency, fixed_ms, per_item_ms)})
    finally:
        server.load_model(model, config=base)
    return rows, cycles
