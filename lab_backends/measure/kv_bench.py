"""``lab-backends bench kvcache``: what a KV cache and paged KV memory buy, measured on ONE server.

lab_kvcache serves kvlm three ways (model_repository/generate_kv_paged, generate_kv_contiguous,
generate_kv_recompute: one backend, one model file, one budget of 128 blocks x 8 tokens), plus copies
of the first two whose every step lasts at least ``step_ms`` (10 ms: the fixed cost of a large model's
step, reading its weights, which this 122k-parameter model does not have; :func:`paced_repository`).
Three tables, printed and written to ``bench/``:

* ``kv_cache_vs_recompute.csv``: tokens/s with the cache (paged) and recomputing the prefix, by sequence
  length (prompt + generated), for 1 sequence and for 8 at once, two ways: streamed (the client's rate,
  tokens / (last FINAL - first request sent), median of ``repeats`` runs: it includes each step's round
  trip through the scheduler, RESCHEDULE and the response; arrival times of single tokens are not used,
  gRPC delivers them in bursts) and computed (tokens per
  second of the backend's forward passes, from Triton's batch statistics: the model's own cost).
* ``kv_ttft.csv``: time to first token against prompt length (the prefill's cost), one request alone,
  median of ``repeats``, and the prefill's own compute time (Triton's statistics).
* ``kv_budget.csv``: the lesson's 32 requests of mixed lengths (:func:`kv_streams.lesson_mix`) at once,
  paged vs contiguous under the same budget: most sequences in one step, mean sequences per step,
  tokens/s, wall time and the KV memory reserved but unused (%), unpaced and paced (the run of median
  tokens/s of ``repeats``), and how many sequences were preempted and prefilled again (re_prefills).

Every figure comes from the tokens' own records (BATCH, BLOCKS), client clocks or Triton's statistics;
nothing is asserted here (tests/test_kv_native.py checks what must hold). Notebook 08c measures with these
same functions at lesson size (:mod:`lab_backends.lessons.kv_lesson` adds the claims it checks), so the
lesson's numbers and the bench's are one measurement, sized two ways.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from lab_backends.charlm.text import zen
from lab_backends.errors import StreamingError
from lab_backends.kvlm import PLACEMENTS, build_kvlm
from lab_backends.measure.kv_streams import CONTIGUOUS, PAGED, RECOMPUTE, KvAsk, KvRun, lesson_mix, stream_kv
from lab_backends.measure.stats import batch_rows, model_entries, settled_statistics
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

BLOCK_TOKENS = 8
STEP_MS = 10
LENGTHS = (32, 64, 128, 240)  # prompt + generated tokens
PROMPT = 16                   # characters of prompt in the cache-vs-recompute runs
TTFT_PROMPTS = (8, 32, 64, 128, 200)


def place_models() -> None:
    """kvlm.pt in every KV model's version folder, generate_kv_recompute's included (trained when stale)."""
    build_kvlm(placements=tuple(dict.fromkeys((*PLACEMENTS, MODEL_REPOSITORY / RECOMPUTE / "1" / "kvlm.pt"))))


def paced(model: str) -> str:
    return f"{model}_paced"


def paced_repository(folder: Path, step_ms: int = STEP_MS, models: tuple[str, ...] = (PAGED, CONTIGUOUS)) -> Path:
    """A repository of copies of ``models`` named ``<model>_paced`` whose steps last >= ``step_ms`` (config
    parameter step_ms of lab_kvcache), each with the model's kvlm.pt; ``folder``."""
    for model in models:
        config = read_config(MODEL_REPOSITORY / model)
        config.name = paced(model)
        config.parameters["step_ms"].string_value = str(step_ms)
        (folder / config.name / "1").mkdir(parents=True, exist_ok=True)
        (folder / config.name / "config.pbtxt").write_text(config_text(config))
        shutil.copy2(MODEL_REPOSITORY / model / "1" / "kvlm.pt", folder / config.name / "1" / "kvlm.pt")
    return folder


def complete(run: KvRun) -> KvRun:
    """``run``, if every generation got all its tokens and its FINAL flag; else one line naming the model."""
    if not run.complete:
        raise StreamingError(f"{run.model}: a generation did not complete: "
                             f"{(run.errors or ['no FINAL flag'])[0].splitlines()[0][:300]}; is the server overloaded? "
                             "run it again")
    return run


def computed(server: RunningServer, model: str) -> tuple[int, int]:
    """(tokens, nanoseconds) the model has computed so far: its batch_stats, where lab_kvcache reports each
    execution's sequences and its forward pass's time (compute_infer), so no transport is counted."""
    entry = model_entries(settled_statistics(server, model), model)[0]
    stats = entry.get("batch_stats", [])
    return batch_rows(entry), sum(int(b["compute_infer"]["ns"]) for b in stats)


def _quiet(message: str) -> None:
    """The lesson's log: its tables speak, nothing is printed."""


def cache_vs_recompute(server: RunningServer, lengths: Sequence[int] = LENGTHS, sequences: Sequence[int] = (1, 8),
                       repeats: int = 1, log: Callable[[str], None] = _quiet) -> pd.DataFrame:
    """Per sequence length (prompt + generated) and sequences at once, with and without the cache: the client's
    rate (tokens per second from the first request sent to the last FINAL, median of ``repeats``) and the
    server's compute rate (tokens per second of forward passes, over all the repeats)."""
    rows = []
    for at_once in sequences:
        for length in lengths:
            asks = [KvAsk(f"c{i}", zen()[i * 40:i * 40 + PROMPT], length - PROMPT) for i in range(at_once)]
            row: dict = {"sequences": at_once, "length": length}
            for model, label in ((PAGED, "cache"), (RECOMPUTE, "recompute")):
                before = computed(server, model)
                row[f"{label}_tokens_per_s"] = statistics.median(
                    complete(stream_kv(server, model, asks)).tokens_per_s() for _ in range(repeats))
                after = computed(server, model)
                row[f"{label}_compute_tokens_per_s"] = (after[0] - before[0]) / ((after[1] - before[1]) / 1e9)
            row["ratio"] = row["cache_tokens_per_s"] / row["recompute_tokens_per_s"]
            row["compute_ratio"] = row["cache_compute_tokens_per_s"] / row["recompute_compute_tokens_per_s"]
            rows.append(row)
            log(f"  {at_once} sequence(s) of {length:3d} tokens: streamed {row['cache_tokens_per_s']:6.0f} vs "
                f"{row['recompute_tokens_per_s']:6.0f} tokens/s ({row['ratio']:.1f}x); computed "
                f"{row['cache_compute_tokens_per_s']:7.0f} vs {row['recompute_compute_tokens_per_s']:6.0f} "
                f"({row['compute_ratio']:.1f}x)")
    return pd.DataFrame(rows)


def prefill_cost(server: RunningServer, prompts: Sequence[int] = TTFT_PROMPTS, repeats: int = 1,
                 log: Callable[[str], None] = _quiet) -> pd.DataFrame:
    """Per prompt length: the client's time to first token (median of ``repeats``) and the prefill's own
    compute (the server's compute_infer per request of MAX_TOKENS 1: one execution, one prefill). A prefill
    of the longest prompt goes first, unmeasured: the first long pass's one-off costs stay out of the table."""
    complete(stream_kv(server, PAGED, [KvAsk("warm-up", zen()[:max(prompts)], 1)]))
    rows = []
    for chars in prompts:
        before = computed(server, PAGED)
        ms = statistics.median(complete(stream_kv(server, PAGED, [KvAsk("t", zen()[:chars], 1)]))["t"].ttft_s * 1e3
                               for _ in range(repeats))
        after = computed(server, PAGED)
        prefill_ms = (after[1] - before[1]) / 1e6 / max(1, after[0] - before[0])
        rows.append({"prompt_chars": chars, "ttft_ms": ms, "prefill_compute_ms": prefill_ms})
        log(f"  prompt of {chars:3d} characters: first token after {ms:6.2f} ms, its prefill computed in "
            f"{prefill_ms:.2f} ms")
    return pd.DataFrame(rows)


def budget_runs(server: RunningServer, step_ms: int = STEP_MS, n: int = 32) -> dict[str, KvRun]:
    """:func:`kv_streams.lesson_mix` of ``n`` at once to the paged, then the contiguous model (their paced
    copies when ``step_ms`` > 0), each run complete: {"paged": run, "contiguous": run}."""
    return {layout: complete(stream_kv(server, paced(model) if step_ms else model, lesson_mix(n), timeout_s=300))
            for model, layout in ((PAGED, "paged"), (CONTIGUOUS, "contiguous"))}


def budget_row(run: KvRun, layout: str, step_ms: int = STEP_MS) -> dict:
    """One run under the budget, from its records: sequences per step (most, mean), tokens/s, KV held unused."""
    r = run.records()
    return {"layout": layout, "step_ms": step_ms, "requests": len(run.generations), "tokens": len(r),
            "max_at_once": run.max_batch(), "mean_at_once": len(r) / (1 / r["batch"]).sum(),
            "tokens_per_s": run.tokens_per_s(), "wall_s": run.wall_s,
            "waste_pct": 100 * run.waste(BLOCK_TOKENS),
            "re_prefills": int(((r["kind"] == "prefill") & (r["step"] > 0)).sum())}


def budget(server: RunningServer, repeats: int = 1, log: Callable[[str], None] = _quiet) -> pd.DataFrame:
    """Paged vs contiguous, unpaced and paced: per layout and pace the run of median tokens/s of ``repeats``."""
    rows = []
    for step_ms in (0, STEP_MS):
        tries = [budget_runs(server, step_ms) for _ in range(repeats)]
        for layout in ("paged", "contiguous"):
            row = sorted((budget_row(t[layout], layout, step_ms) for t in tries),
                         key=lambda r: r["tokens_per_s"])[len(tries) // 2]
            rows.append(row)
            log(f"  {layout:10s} step >= {step_ms:2d} ms: {row['max_at_once']:2d} at most at once (mean "
                f"{row['mean_at_once']:.1f}), {row['tokens_per_s']:6.0f} tokens/s, {row['waste_pct']:4.1f}% of "
                f"reserved KV slots unused, {row['re_prefills']} re-prefills")
    return pd.DataFrame(rows)


def kv_bench(out_dir: str | Path = PROJECT_ROOT / "bench", quick: bool = False,
             log: Callable[[str], None] = print) -> dict[str, pd.DataFrame]:
    """The three tables on one fresh server; written to ``out_dir/kv_*.csv``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    repeats = 1 if quick else 3
    place_models()
    variants = paced_repository(out_dir / ".kv_paced_repository")
    try:
        with TritonServer([MODEL_REPOSITORY, variants], target="local", startup_timeout_s=180,
                          models=[PAGED, CONTIGUOUS, RECOMPUTE, paced(PAGED), paced(CONTIGUOUS)]) as server:
            stream_kv(server, PAGED, [KvAsk("warm-up", "Beautiful", 4)])  # first-execution costs stay out
            stream_kv(server, RECOMPUTE, [KvAsk("warm-up", "Beautiful", 4)])
            log("decode with the KV cache vs recomputing the prefix:")
            tables = {"kv_cache_vs_recompute": cache_vs_recompute(server, repeats=repeats, log=log)}
            log("time to first token against prompt length (prefill):")
            tables["kv_ttft"] = prefill_cost(server, repeats=repeats, log=log)
            log(f"the lesson's 32 requests under one budget (128 blocks x {BLOCK_TOKENS} tokens):")
            tables["kv_budget"] = budget(server, repeats, log)
    finally:
        shutil.rmtree(variants, ignore_errors=True)
    for name, frame in tables.items():
        frame.to_csv(out_dir / f"{name}.csv", index=False, float_format="%.4g")
        log(f"{name}:\n{frame.to_string(index=False, float_format=lambda x: f'{x:.3g}')}")
    return tables
