"""Notebook 08c: inside an LLM backend. The KV cache, prefill and decode, paged memory, from the models' records.

One server holds every KV model of issue 48: ``generate_kv`` (kvlm in a Python backend, the cache in the
stub, ``model_repository/generate_kv/1/model.py``), and lab_kvcache's three layouts in C++
(``generate_kv_paged``, ``generate_kv_contiguous``, ``generate_kv_recompute``: 128 blocks x 8 tokens each)
plus the paged and contiguous ones paced (every step >= 10 ms, the fixed cost of a large model's step;
:func:`lab_backends.measure.kv_bench.paced_repository`). This module arranges what the lesson shows:

* :func:`records_demo`: a few generations of mixed lengths on each model; every token carries the model's
  record of its step (STEP, KIND, BATCH, BLOCKS, FREE_BLOCKS: :mod:`lab_backends.measure.kv_streams`).
  :func:`milestones` keeps the rows where something happens (the prefill, a new block, the end);
  :func:`blocks_as_layout` and :func:`kinds_as_taught` check them against what the code says; the texts
  are compared with the reference decoder (greedy, NO cache: :mod:`lab_backends.kvlm.reference`).
* :func:`cache_vs_recompute`, :func:`prefill_cost`, :func:`budget`: the bench's three measurements
  (``lab-backends bench kvcache``, :mod:`lab_backends.measure.kv_bench`: the same functions, called here
  with a lesson's sizes), each a table, with the claims the lesson checks (:func:`claims_cache`,
  :func:`claims_prefill`, :func:`claims_budget`). Evidence first from the records
  (sequences at once, memory held: counts, not clocks); the timings are ratios within one run, computed
  from the server's own statistics (``batch_stats``: the forward passes' time, no transport), with bounds
  far from what was measured (a 2x slower machine slows both sides of a ratio).

Deferred imports: matplotlib (~1 s, only to draw) and the reference decoder (torch, 1-6 s).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lab_backends.errors import LabBackendsError
from lab_backends.kvlm import ARTIFACT, PLACEMENTS
from lab_backends.measure.kv_bench import (
    BLOCK_TOKENS,
    STEP_MS,
    budget_row,
    budget_runs,
    cache_vs_recompute,
    complete,
    paced,
    paced_repository,
    prefill_cost,
)
from lab_backends.measure.kv_streams import CONTIGUOUS, PAGED, RECOMPUTE, KvAsk, KvRun, free_blocks_after, stream_kv
from lab_backends.notebook import Claim
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server.running import RunningServer

PYTHON = "generate_kv"
MODELS = (PYTHON, PAGED, CONTIGUOUS, RECOMPUTE, paced(PAGED), paced(CONTIGUOUS))
MODEL_PY = MODEL_REPOSITORY / PYTHON / "1" / "model.py"
KV_BLOCKS_PY = MODEL_REPOSITORY / PYTHON / "1" / "kv_blocks.py"
KVCACHE_CC = PROJECT_ROOT / "c_backends" / "frameworks" / "lab_kvcache" / "lab_kvcache.cc"
#: The records demo: prompts of 4-34 characters (lines of the Zen), 8-40 tokens; "now" crosses block boundaries.
DEMO = (KvAsk("beautiful", "Beautiful is better than ugly.", 24), KvAsk("now", "Now is", 40),
        KvAsk("errors", "Errors should never pass silently.", 8), KvAsk("flat", "Flat", 20))


def repositories() -> list[Path]:
    """The model repositories a lesson's server loads: the project's and one of paced copies (temporary); set-up
    must have run (kvlm trained and placed, lab_kvcache built)."""
    missing = [p for p in (ARTIFACT, *PLACEMENTS, BACKEND_DIR / "lab_kvcache") if not p.exists()]
    if missing:
        raise LabBackendsError(f"{missing[0]} is missing: run `lab-backends setup` (it trains kvlm and builds "
                               "lab_kvcache), then this cell again")
    folder = Path(tempfile.mkdtemp(prefix="kv-paced-"))
    atexit.register(shutil.rmtree, folder, True)  # 1 MB of copies a run: gone with the kernel
    return [MODEL_REPOSITORY, paced_repository(folder)]


def parameters(server: RunningServer, model: str) -> dict[str, str]:
    """The model's config parameters (kv_blocks, block_tokens, kv_layout ...), as the server loaded them."""
    return {k: v.string_value for k, v in server.model_config(model).parameters.items()}


# ------------------------------------------------------------------------------ the records


def records_demo(server: RunningServer, model: str, asks: Sequence[KvAsk] = DEMO) -> KvRun:
    """``asks`` sent at once to ``model`` on one stream; every one must complete."""
    return complete(stream_kv(server, model, asks, timeout_s=60))


def milestones(run: KvRun) -> pd.DataFrame:
    """The rows where something happens to a sequence: its prefill, a change in the blocks it holds, its end."""
    r = run.records().sort_values(["request", "step"], ignore_index=True)
    changed = r["blocks"] != r.groupby("request")["blocks"].shift()
    last = r["step"] == r.groupby("request")["step"].transform("max")
    keep = r[(r["step"] == 0) | changed | last].copy()
    keep["cached"] = keep["prompt"] + keep["step"]
    return keep[["request", "prompt", "step", "cached", "kind", "batch", "blocks", "free_blocks"]]


def blocks_as_layout(run: KvRun, block_tokens: int, reserve: int = 0) -> bool:
    """Every record's BLOCKS as the layout says: paged (``reserve`` 0), ceil(cached / block_tokens) after a step
    that cached prompt + step tokens; contiguous, ``reserve`` blocks from the first step on; 0 after the last."""
    r = run.records()
    last = r["step"] == r.groupby("request")["step"].transform("max")
    need = (r["prompt"] + r["step"] + block_tokens - 1) // block_tokens if not reserve else reserve
    return bool(((r["blocks"] == need) | last).all() and (r.loc[last, "blocks"] == 0).all())


def kinds_as_taught(run: KvRun) -> bool:
    """Token 0 of every sequence came from a prefill, every later one from a decode (no preemption here)."""
    r = run.records()
    return bool(((r["kind"] == "prefill") == (r["step"] == 0)).all())


def pool_free_after(server: RunningServer, model: str) -> int:
    """FREE_BLOCKS in the record of a 1-token probe sent after every sequence ended (its own block freed with it)."""
    return free_blocks_after(server, model)


def reference_texts(asks: Sequence[KvAsk]) -> dict[str, str]:
    """What greedy decoding with NO cache produces for each ask: the whole prefix through kvlm for every token."""
    from lab_backends.kvlm import reference  # torch: only this comparison needs it in the kernel

    model = reference.load(ARTIFACT)
    return {a.name: reference.generate(model, a.prompt, a.max_tokens) for a in asks}


# ------------------------------------------------------------------------------ the measurements


def budget(server: RunningServer, n: int = 32) -> dict[str, KvRun]:
    """The lesson's ``n`` requests of mixed lengths at once on the paced paged and contiguous models."""
    return budget_runs(server, STEP_MS, n)


def all_sent_before_first_final(run: KvRun) -> bool:
    """Every request was sent before any finished: "at once" then means what the model admitted, not the client."""
    return max(g.sent_s for g in run.generations) < min(g.final_s for g in run.generations)


def budget_table(runs: dict[str, KvRun]) -> pd.DataFrame:
    """One row per layout: most and mean sequences per step (BATCH), tokens/s, reserved KV slots unused (%)."""
    return pd.DataFrame([budget_row(run, layout) for layout, run in runs.items()]).set_index("layout")


def _at(table: pd.DataFrame, column: str, **where: int) -> float:
    rows = table
    for key, value in where.items():
        rows = rows[rows[key] == value]
    return float(rows[column].iloc[0])


def claims_cache(longest: int) -> list[Claim]:
    return [Claim(f"at {longest} tokens the cache computes tokens several times faster than recomputing the prefix",
                  lambda t: _at(t, "compute_ratio", sequences=1, length=longest), above=2.0,
                  what="computed tokens/s, cache / recompute")]


def claims_prefill(shortest: int, longest: int) -> list[Claim]:
    return [Claim(f"a prefill of {longest} characters costs more than one of {shortest}: one pass, but over "
                  "every position of the prompt",
                  lambda t: _at(t, "prefill_compute_ms", prompt_chars=longest)
                  / _at(t, "prefill_compute_ms", prompt_chars=shortest), above=1.3,
                  what=f"prefill compute, {longest} / {shortest} characters")]


def claims_budget() -> list[Claim]:
    return [Claim("under one budget and 10 ms steps, paged memory streams more tokens per second than contiguous",
                  lambda runs: runs["paged"].tokens_per_s() / runs["contiguous"].tokens_per_s(), above=1.5,
                  what="tokens/s, paged / contiguous")]


# ------------------------------------------------------------------------------ figures


def plot_measurements(cache: pd.DataFrame, prefill: pd.DataFrame, table: pd.DataFrame) -> Any:
    """Three panels: tokens/s by length (cache vs recompute); TTFT and prefill by prompt length; paged vs contiguous."""
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    for at_once, group in cache.groupby("sequences"):
        for label, marker in (("cache", "o"), ("recompute", "s")):
            left.plot(group["length"], group[f"{label}_compute_tokens_per_s"], marker=marker,
                      label=f"{label}, {at_once} at once")
    left.set(xlabel="sequence length (prompt + generated)", ylabel="tokens/s (server compute)", yscale="log",
             title="decode: KV cache vs recompute")
    left.legend(fontsize=8)
    middle.plot(prefill["prompt_chars"], prefill["ttft_ms"], marker="o", label="time to first token (client)")
    middle.plot(prefill["prompt_chars"], prefill["prefill_compute_ms"], marker="s", label="prefill compute (server)")
    middle.set(xlabel="prompt length (characters)", ylabel="ms", title="prefill: cost grows with the prompt")
    middle.legend(fontsize=8)
    columns = ["max_at_once", "mean_at_once", "waste_pct"]
    x = range(len(columns))
    for offset, layout in ((-0.2, "paged"), (0.2, "contiguous")):
        right.bar([i + offset for i in x], [table.loc[layout, c] for c in columns], width=0.4, label=layout)
    right.set_xticks(list(x), ["most at once", "mean at once", "% of KV held unused"], fontsize=9)
    right.set_title(f"one budget (128 blocks x {BLOCK_TOKENS}): paged vs contiguous")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


__all__ = ["CONTIGUOUS", "DEMO", "KVCACHE_CC", "KV_BLOCKS_PY", "MODELS", "MODEL_PY", "PAGED", "PYTHON", "RECOMPUTE",
           "all_sent_before_first_final", "blocks_as_layout", "budget", "budget_table", "cache_vs_recompute",
           "claims_budget", "claims_cache", "claims_prefill", "kinds_as_taught", "milestones", "parameters",
           "plot_measurements", "pool_free_after", "prefill_cost", "records_demo", "reference_texts", "repositories"]
