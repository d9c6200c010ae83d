"""Run notebooks as a learner of a class does: against a shared server, without its admin key.

    PYTHONPATH=$PWD .venv/bin/python scripts/shared_server_check.py [notebooks/NN_x.ipynb ...]

Stands up one embedded Triton with every CPU model loaded and the same restricted APIs as
deploy/triton/statefulset.yaml (model-repository, trace, shared-memory, logging; statistics
open), then runs each notebook under nbval (LAB_FAST=1) with TRITON_URL / TRITON_GRPC_URL /
TRITON_METRICS_URL pointing at it and no TRITON_ADMIN_KEY. Lessons that need the key must fall
back to the learner's own embedded server (server/endpoints.py: fallback_target) and still pass.
Too slow for `make test` (~5 min for all 13); tests/test_class_plan.py checks the notebooks'
targets statically instead. Exit status: the number of notebooks that failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure_footprint import nbval_command  # noqa: E402  (this folder is on sys.path when run as a script)

from lab_backends.paths import lesson_notebooks  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

#: What deploy/'s shared Triton keeps behind the admin key (statistics stay open for the lessons).
DEPLOY_RESTRICTED = ("model-repository", "trace", "shared-memory", "logging")


def main(paths: list[str]) -> int:
    notebooks = [Path(p) for p in paths] or lesson_notebooks()
    failed = 0
    # models=None: every model of the repository, as deploy/'s shared server loads them.
    with TritonServer(models=None, target="local", restricted_apis=DEPLOY_RESTRICTED) as shared:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
        env.update(TRITON_URL=f"http://{shared.http_url}", TRITON_GRPC_URL=shared.grpc_url,
                   TRITON_METRICS_URL=shared.metrics_url, LAB_FAST=env.get("LAB_FAST", "1"), PYTHONPATH=str(ROOT))
        print(f"shared server: {shared.http_url} (no admin key given to the notebooks)", flush=True)
        for notebook in notebooks:
            started = time.monotonic()
            run = subprocess.run(nbval_command(notebook), cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=900)
            last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
            verdict = "ok" if run.returncode == 0 else "FAILED"
            print(f"{notebook.name}: {verdict} in {time.monotonic() - started:.0f} s: {last}", flush=True)
            if run.returncode:
                failed += 1
                print(run.stdout[-4000:], flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
