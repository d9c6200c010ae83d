"""``lab-backends bench continuous``: static vs iterative (continuous) batching of one generative model.

The same character model, the same step cost, served two ways (model_repository/generate_static,
generate_iterative), on ONE server, in one run: 8 concurrent gRPC streams, each sending requests
one after another (a closed loop) whose lengths mix 4..64 tokens (:func:`generation.closed_loop`).
Printed and written to ``bench/continuous.csv``: tokens/s over the run, p50/p90 time to first
token, p90 latency, executions and their mean batch, forward passes and tokens per pass (from the
model's records), and the ratios iterative / static side by side.

What to expect, and why: a static batch runs until its longest member is done, so a stream whose
short request finished early waits (its next request queues behind the whole batch: long time to
first token), and the batch's rows of finished requests compute padding (fewer useful tokens per
step). Iterative scheduling admits the next request at the next step: rows stay busy with real work.

:func:`compare` is also what notebook 08b runs (smaller), so the lesson prints the bench's comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from lab_backends.measure.generation import ITERATIVE, STATIC, GenerationRun, closed_loop, run_streams, warm_up
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

COLUMNS = ["model", "requests", "tokens", "wall_s", "tokens_per_s", "ttft_p50_ms", "ttft_p90_ms",
           "latency_p90_ms", "executions", "mean_batch", "forward_passes", "tokens_per_pass", "complete"]


def compare(server: RunningServer, streams: int = 8, rounds: int = 4,
            log: Callable[[str], None] = lambda message: None) -> dict[str, GenerationRun]:
    """The same closed loop against both models, static first; each warmed up just before."""
    runs = {}
    for model in (STATIC, ITERATIVE):
        warm_up(server, model)
        runs[model] = run_streams(server, model, closed_loop(streams, rounds))
        s = runs[model].summary()
        log(f"{model:20s} {s['tokens_per_s']:7.0f} tokens/s  p90 TTFT {s['ttft_p90_ms']:7.1f} ms  "
            f"{s['executions']} executions, mean batch {s['mean_batch']:.2f}")
    return runs


def table(runs: dict[str, GenerationRun]) -> pd.DataFrame:
    """One row per model, then the row of ratios iterative / static."""
    frame = pd.DataFrame([runs[m].summary() for m in (STATIC, ITERATIVE)])[COLUMNS]
    ratio = {c: frame[c].iloc[1] / frame[c].iloc[0] for c in COLUMNS[1:-1]}
    return pd.concat([frame, pd.DataFrame([{"model": "iterative / static", **ratio, "complete": None}])],
                     ignore_index=True)


def ratios(runs: dict[str, GenerationRun]) -> dict[str, float]:
    """The table's last row, iterative / static, column by column: the figures notebook 08b's claims check."""
    row = table(runs).iloc[-1]
    return {c: float(row[c]) for c in COLUMNS[1:-1]}


def continuous_bench(out_dir: str | Path = PROJECT_ROOT / "bench", quick: bool = False,
                     log: Callable[[str], None] = print) -> pd.DataFrame:
    """Run the comparison once on a fresh server; write ``continuous.csv``; print the table."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with TritonServer(models=[STATIC, ITERATIVE], target="local") as server:
        frame = table(compare(server, streams=8, rounds=2 if quick else 4, log=log))
    frame.to_csv(out_dir / "continuous.csv", index=False, float_format="%.4g")
    log(frame.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    return frame
