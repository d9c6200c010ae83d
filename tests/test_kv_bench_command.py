"""``lab-backends bench kvcache --quick``, run literally as the README shows it (a fresh server of its own):
its three tables are written with their columns, and what the records decide (not the clock) holds.

The bench asserts nothing itself (speed is measured, not asserted): here only what is deterministic is
checked: the lengths and prompts it measured, the tokens it streamed, and under the one budget how many
sequences each layout ran at once and the memory it held unused (from the model's own records).
"""

from __future__ import annotations

import subprocess

import pandas as pd
import pytest

from lab_backends.paths import PROJECT_ROOT

pytestmark = pytest.mark.server

COLUMNS = {
    "kv_cache_vs_recompute": ["sequences", "length", "cache_tokens_per_s", "cache_compute_tokens_per_s",
                              "recompute_tokens_per_s", "recompute_compute_tokens_per_s", "ratio", "compute_ratio"],
    "kv_ttft": ["prompt_chars", "ttft_ms", "prefill_compute_ms"],
    "kv_budget": ["layout", "step_ms", "requests", "tokens", "max_at_once", "mean_at_once", "tokens_per_s",
                  "wall_s", "waste_pct", "re_prefills"],
}


def test_bench_kvcache_writes_its_tables_and_the_records_hold(tmp_path) -> None:
    run = subprocess.run([str(PROJECT_ROOT / ".venv" / "bin" / "lab-backends"), "bench", "kvcache", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=540, cwd=PROJECT_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    tables = {name: pd.read_csv(tmp_path / f"{name}.csv") for name in COLUMNS}
    for name, columns in COLUMNS.items():
        assert list(tables[name].columns) == columns, name
    lengths = tables["kv_cache_vs_recompute"]
    assert 240 in set(lengths["length"]) and (lengths[COLUMNS["kv_cache_vs_recompute"][2:]] > 0).all().all()
    assert tables["kv_ttft"]["prompt_chars"].is_monotonic_increasing and len(tables["kv_ttft"]) >= 3
    budget = tables["kv_budget"]
    for _, row in budget.iterrows():
        assert row["requests"] == 32 and row["tokens"] > 0, row
    # With 10 ms steps every request is in before the first ends (the paced rows; unpaced ones may race them).
    paced = budget[budget["step_ms"] > 0]
    paged, contiguous = (paced[paced["layout"] == layout] for layout in ("paged", "contiguous"))
    assert len(paged) and len(contiguous), budget
    # 128 blocks of 8 tokens: contiguous reserves 256 positions (32 blocks) a sequence, 4 at once; paged >= 3x.
    assert (contiguous["max_at_once"] == 4).all() and (paged["max_at_once"] >= 12).all(), budget
    assert (paged["waste_pct"] < 10).all() and (contiguous["waste_pct"] > 50).all(), budget
    assert "kv_budget:" in run.stdout
