"""``lab-backends bench batching``: the batching benchmark and the load-generator check, in one run.

Writes four files (default folder ``bench/``):

* ``batching.csv``: ``model,protocol,batching,concurrency,requests,throughput_rps,p50_ms,p90_ms,p99_ms,avg_batch``
  for ``cost_model`` (and ``digits_torch`` once built) without and with dynamic batching, at
  concurrency 1, 4 and 16 over gRPC; ``cost_model`` also with the ``byte_budget`` batching strategy;
* ``loadgen.csv``: ``tool,model,concurrency,throughput_rps``: our HTTP load generator next to
  ``wrk`` (Debian package) on the same model, config and concurrency, in interleaved rounds, plus
  our gRPC generator and the stock ``tritonclient.grpc.aio`` client for comparison; once on the bench's
  dynamic ``cost_model``, once with its cost set to zero (so the clients' own cost shows);
* ``batching.png``: throughput, latency and batch sizes per model;
* ``cycle.csv``: for each load generator on the dynamic ``cost_model``, where one batch's cycle
  goes (the model's cost, the Python backend's hand-off, the turnaround through client and front
  end) and the fraction of the ceiling the server alone allows (:mod:`lab_backends.measure.reference_tools`).

This is a benchmark, not a test: it asserts nothing, it prints the targets next to what it measured.

Deferred import: matplotlib (~1 s), only when the figure is drawn.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from lab_backends.measure import plots
from lab_backends.measure.reference_tools import CYCLE_COLUMNS, compare_loadgens, cost_model_ceiling
from lab_backends.measure.sweep import NO_BATCHING, sweep
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server import cbackend
from lab_backends.server.triton_server import TritonServer

BATCHING_COLUMNS = ["model", "protocol", "batching", "concurrency", "requests", "throughput_rps",
                    "p50_ms", "p90_ms", "p99_ms", "avg_batch"]
LOADGEN_COLUMNS = ["tool", "model", "concurrency", "throughput_rps"]
CONCURRENCY = (1, 4, 16)

#: The dynamic batcher used for each model (derived from the live config; the rest is kept).
#: cost_model: with one instance and 16 clients, no delay splits the clients into two groups that
#: alternate (a half batch runs while the other half waits), and a delay alone makes every batch
#: wait it out; a preferred size equal to the clients in flight, with a delay longer than one
#: execution, lets the group that just returned join the waiting one, so full batches run.
#: digits_torch: its batcher takes whatever is queued when the instance frees up; with 16 in flight
#: that is already ~8 requests, and a queue delay only adds waiting (measured: no delay 2.9x to
#: 3.0x over no batching at c=16, a 1 ms delay 2.5x).
DYNAMIC: dict[str, dict[str, Any]] = {
    "cost_model": {"dynamic_batching": {"preferred_batch_size": [16], "max_queue_delay_microseconds": 20000}},
    "digits_torch": {"dynamic_batching": {}},
}
DEFAULT_DYNAMIC: dict[str, Any] = {"dynamic_batching": {}}
#: cost_model's third config: the dynamic batcher plus the byte_budget batching strategy in C
#: (``c_backends/batching/byte_budget``) at 256 bytes of input per batch, i.e. 4 rows of 16 FP32, with
#: every size preferred so that each batch is closed when sent (notebook 09b, section 4).
STRATEGY_BUDGET = 256


def strategy_configs(max_batch_size: int = 64) -> dict[str, dict[str, Any]]:
    """``{"byte_budget 256": override}`` for cost_model; builds the strategy if it is missing."""
    library = cbackend.build_all_strategies()["byte_budget"]
    return {f"byte_budget {STRATEGY_BUDGET}": {
        "parameters": {"TRITON_BATCH_STRATEGY_PATH": {"string_value": str(library)},
                       "MAX_BATCH_BYTES": {"string_value": str(STRATEGY_BUDGET)}},
        "dynamic_batching": {"preferred_batch_size": list(range(1, max_batch_size + 1))},
    }}


def available_models(log: Callable[[str], None] = print) -> list[str]:
    """``cost_model`` always; ``digits_torch`` when its trained weights were built."""
    models = ["cost_model"]
    torch_dir = MODEL_REPOSITORY / "digits_torch"
    if torch_dir.is_dir():
        version = torch_dir / "1"
        if version.is_dir() and any(p.name != "model.py" and p.is_file() for p in version.iterdir()):
            models.append("digits_torch")
        else:
            log(f"digits_torch skipped: no trained weights in {version}; run `lab-backends build-models` first")
    else:
        log("digits_torch skipped: model_repository/digits_torch does not exist in this checkout")
    return models


# ------------------------------------------------------------------------------------ the bench


def _batching_rows(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.rename(columns={"config": "batching"})
    return out[BATCHING_COLUMNS]


def batching_bench(
    out_dir: Path | str = PROJECT_ROOT / "bench",
    quick: bool = False,
    models: list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    requests: int | None = None,
    duration_s: float | None = None,
    loadgen_s: float | None = None,
) -> dict[str, Any]:
    """Run everything and write the three files; returns the two frames and the paths.

    Each point is bounded by ``requests`` and ``duration_s`` (defaults: 1500 / 10 s, ``quick``:
    300 / 3 s); each load generator runs ``loadgen_s`` (10 s, ``quick``: 3 s).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = models or available_models(log)
    requests = requests or (300 if quick else 1500)
    duration = duration_s or (3.0 if quick else 10.0)
    loadgen_s = loadgen_s or (3.0 if quick else 10.0)
    started = time.monotonic()
    batching, loadgen, cycles = [], [], []
    with TritonServer(models=models, allow_broken_models=True, startup_timeout_s=300) as server:
        for name, reason in server.broken_models.items():
            log(f"{name} skipped: it failed to load: {reason}")
        served = [m for m in models if m not in server.broken_models]
        for model in served:
            # The strategy (cost_model only) before "dynamic": the load generators below derive their
            # config from the live one, which must not keep TRITON_BATCH_STRATEGY_PATH.
            strategy = strategy_configs(server.model_config(model).max_batch_size) if model == "cost_model" else {}
            configs = {"none": NO_BATCHING, **strategy, "dynamic": DYNAMIC.get(model, DEFAULT_DYNAMIC)}
            frame = sweep(server, model, CONCURRENCY, configs, protocol="grpc", requests=requests,
                          duration_s=duration, progress=progress, restore=False)
            frame["model"] = model
            batching.append(_batching_rows(frame))
            if model != "cost_model":
                continue
            rows, cycle_rows = compare_loadgens(server, model, configs["dynamic"], loadgen_s, log)
            loadgen += rows
            cycles += cycle_rows
    batching_frame = pd.concat(batching, ignore_index=True) if batching else pd.DataFrame(columns=BATCHING_COLUMNS)
    loadgen_frame = pd.DataFrame(loadgen)
    cycle_frame = pd.DataFrame(cycles).reindex(columns=CYCLE_COLUMNS)
    paths = {
        "batching": out_dir / "batching.csv",
        "loadgen": out_dir / "loadgen.csv",
        "cycle": out_dir / "cycle.csv",
        "figure": out_dir / "batching.png",
    }
    batching_frame.round(3).to_csv(paths["batching"], index=False)
    loadgen_frame.reindex(columns=LOADGEN_COLUMNS).round(1).to_csv(paths["loadgen"], index=False)
    cycle_frame.round(3).to_csv(paths["cycle"], index=False)
    figure(batching_frame).savefig(paths["figure"], dpi=100)
    log(report(batching_frame, loadgen_frame, cycle_frame))
    log(f"wrote {', '.join(str(p) for p in paths.values())} in {time.monotonic() - started:.0f} s")
    return {"batching": batching_frame, "loadgen": loadgen_frame, "cycle": cycle_frame, "paths": paths}


def figure(frame: pd.DataFrame) -> Any:
    """One row per model: throughput and p50/p99 vs concurrency, without and with batching."""
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(frame["model"])) or ["(none)"]
    fig = Figure(figsize=(12, 4 * len(models)))
    axes = fig.subplots(len(models), 3, squeeze=False)
    for row, model in zip(axes, models):
        part = frame[frame["model"] == model]
        ceiling = cost_model_ceiling if model == "cost_model" else None
        plots.throughput_vs_concurrency(part, row[0], by="batching", ceiling=ceiling)
        plots.latency_vs_concurrency(part, row[1], percentiles=(50, 99), by="batching")
        plots.latency_throughput(part, row[2], by="batching")
        for ax in row:
            ax.set_title(f"{model}: {ax.get_title()}")
    fig.tight_layout()
    return fig


def report(batching: pd.DataFrame, loadgen: pd.DataFrame, cycle: pd.DataFrame | None = None) -> str:
    """Markdown tables plus the issue's targets, computed from the rows."""
    lines = [
        "| model | batching | c | req/s | p50 ms | p90 ms | p99 ms | avg batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in batching.iterrows():
        lines.append(f"| {r.model} | {r.batching} | {r.concurrency} | {r.throughput_rps:.0f} | {r.p50_ms:.1f} | "
                     f"{r.p90_ms:.1f} | {r.p99_ms:.1f} | {r.avg_batch:.1f} |")
    lines += ["", "| tool | model | c | req/s | client CPU µs/request |", "|---|---|---|---|---|"]
    for _, r in loadgen.iterrows():
        cpu = "" if pd.isna(r.get("client_cpu_us")) else f"{r.client_cpu_us:.0f}"
        lines.append(f"| {r.tool} | {r.model} | {r.concurrency} | {r.throughput_rps:.0f} | {cpu} |")
    lines.append("")
    if cycle is not None and len(cycle):
        lines += ["One cost_model batch, c=16 (ms): cycle = model + backend hand-off + turnaround", "",
                  "| tool | req/s | of ceiling | cycle | model | backend | turnaround | server alone allows |",
                  "|---|---|---|---|---|---|---|---|"]
        for _, r in cycle.iterrows():
            lines.append(f"| {r.tool} | {r.throughput_rps:.0f} | {r.of_ceiling:.2f} | {r.cycle_ms:.2f} | "
                         f"{r.model_ms:.2f} | {r.backend_ms:.2f} | {r.turnaround_ms:.2f} | {r.server_bound:.2f} |")
        lines.append("")

    def at(model: str, batching_kind: str, c: int = 16) -> pd.Series | None:
        hit = batching[(batching.model == model) & (batching.batching == batching_kind) & (batching.concurrency == c)]
        return hit.iloc[0] if len(hit) else None

    dyn = at("cost_model", "dynamic")
    if dyn is not None:
        lines.append(f"- cost_model c=16 dynamic: {dyn.throughput_rps / cost_model_ceiling(16):.2f} of the "
                     f"{cost_model_ceiling(16):.0f} req/s ceiling (no target: the Python backend's hand-off caps it)")
    if cycle is not None and len(cycle):
        # The targets of issue 15: a client is judged against what the server alone allows.
        for _, r in cycle.iterrows():
            ours_http = r.tool.startswith("lab_backends") and r.tool.endswith("http")
            lines.append(f"- {r.tool}: {r.of_ceiling / r.server_bound:.2f} of what the server alone allows "
                         f"({r.server_bound:.2f} of the ceiling){' (target >= 0.85)' if ours_http else ''}")
    for model, target in (("cost_model", 5), ("digits_torch", 2)):
        d, n = at(model, "dynamic"), at(model, "none")
        if d is not None and n is not None:
            lines.append(f"- {model} c=16: dynamic/none throughput {d.throughput_rps / n.throughput_rps:.1f}x "
                         f"(target >= {target}x), p50 {d.p50_ms:.1f} vs {n.p50_ms:.1f} ms")
    for model in dict.fromkeys(loadgen.get("model", [])):
        part = loadgen[loadgen.model == model]
        tools = dict(zip(part.tool, part.throughput_rps))
        # Our HTTP generator, under its current name or the one older CSVs carry ("lab_backends.load http").
        ours = next((t for t in tools if t.startswith("lab_backends") and t.endswith(" http")), None)
        if "wrk" in tools and ours:
            note = (
                "(target >= 0.95)"
                if model == "cost_model"
                else "(diagnostic: no model cost, the clients share the cores)"
            )
            lines.append(f"- {model}: our HTTP generator / wrk = {tools[ours] / tools['wrk']:.2f} {note}")
    return "\n".join(lines)
