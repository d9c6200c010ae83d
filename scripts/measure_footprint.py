"""Run notebooks one at a time under nbval (as CI does) and record each one's footprint.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_footprint.py [notebooks/NN_x.ipynb ...]

Writes bench/scale/footprint.json (one entry per notebook, request streams included) and
bench/scale/footprint.csv; docs/scale.md quotes them. LAB_FAST=1 is passed to the notebooks
unless LAB_FAST is set already. The runner is stopped by its process group if it overruns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_backends.measure.footprint import Sampler  # noqa: E402
from lab_backends.paths import lesson_notebooks  # noqa: E402

OUT = ROOT / "bench" / "scale"
LIMIT_S = 900


def nbval_command(notebook: Path) -> list[str]:
    """One notebook under nbval as `make test` runs it (a longer cell timeout: this measures, CI gates)."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
            "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=300", str(notebook)]


def run_one(notebook: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAB_FAST": os.environ.get("LAB_FAST", "1")}
    cmd = nbval_command(notebook)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    sampler = Sampler(proc.pid)
    try:
        while proc.poll() is None:
            sampler.sample()
            if time.monotonic() - sampler.t0 > LIMIT_S:
                os.killpg(proc.pid, signal.SIGTERM)
                break
            time.sleep(sampler.interval_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode(errors="replace")
    result = sampler.result().as_dict()
    result["passed"] = proc.returncode == 0
    lines = output.strip().splitlines()
    result["tail"] = (
        lines[-1:]
        if proc.returncode == 0
        else [ln for ln in lines if ln.startswith(("FAILED", "E  "))][:12] + lines[-1:]
    )
    return result


def markdown(results: dict) -> str:
    """The table docs/scale.md quotes."""
    head = (
        "| notebook | wall s | server+stubs peak MB | kernel peak MB | server CPU s | kernel CPU s | "
        "requests | peak concurrency | requests per model | cells passed |"
    )
    rows = [head, "|" + "---|" * 10]
    for name, r in sorted(results.items()):
        per_model = ", ".join(f"{m} {n}" for m, n in sorted(r["requests"].items(), key=lambda kv: -kv[1]))
        rows.append(
            f"| {name} | {r['wall_s']} | {r['peak_server_rss_mb']} | {r['peak_kernel_rss_mb']} | "
            f"{r['server_cpu_s']} | {r['kernel_cpu_s']} | {sum(r['requests'].values())} | "
            f"{max(r['peak_concurrency'].values(), default=0.0)} | {per_model or '-'} | "
            f"{'all' if r['passed'] else r['tail'][-1]} |"
        )
    return "\n".join(rows)


def main(paths: list[str]) -> int:
    if paths == ["--table"]:
        print(markdown(json.loads((OUT / "footprint.json").read_text())))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / "footprint.json"
    results = json.loads(target.read_text()) if target.exists() else {}
    notebooks = [Path(p) for p in paths] or lesson_notebooks()
    for nb in notebooks:
        print(f"{nb.name} ...", flush=True)
        results[nb.stem] = run_one(nb)
        r = results[nb.stem]
        print(
            f"  {r['wall_s']} s, server peak {r['peak_server_rss_mb']} MB, server cpu {r['server_cpu_s']} s, "
            f"requests {sum(r['requests'].values())}, passed={r['passed']}",
            flush=True,
        )
        target.write_text(json.dumps(results, indent=1) + "\n")
    import pandas as pd

    rows = [
        {
            "notebook": k,
            **{c: v for c, v in r.items() if c not in ("stream", "tail", "requests", "peak_concurrency")},
            "requests": sum(r["requests"].values()),
            "peak_concurrency": max(r["peak_concurrency"].values(), default=0.0),
            "per_model": "; ".join(f"{m}={n}" for m, n in sorted(r["requests"].items())),
        }
        for k, r in sorted(results.items())
    ]
    pd.DataFrame(rows).to_csv(OUT / "footprint.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
