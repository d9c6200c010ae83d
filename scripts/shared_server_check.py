"""Run notebooks as a learner of a class does: against a shared server, without its admin key.

    PYTHONPATH=$PWD .venv/bin/python scripts/shared_server_check.py [notebooks/NN_x.ipynb ...]

Stands up one embedded Triton with every CPU model loaded and the same restricted APIs as
deploy/triton/statefulset.yaml (model-repository, trace, shared-memory, logging; statistics
open), then runs each notebook under nbval (LAB_FAST=1) with TRITON_URL / TRITON_GRPC_URL /
TRITON_METRICS_URL pointing at it and no TRITON_ADMIN_KEY. Lessons that need the key must fall
back to the learner's own embedded server (server/endpoints.py: fallback_target) and still pass.
Too slow for `make test` (~5 min for all 13); tests/test_class_plan.py checks the notebooks'
targets statically instead. Exit status: the number of notebooks that failed.

    ... scripts/shared_server_check.py --door [notebooks ...]

runs the shared server as `make class` does instead: `serve --front-door` with the learners' shares
(`--learner-secret-file`), and each notebook as learner `ada`, with her token and the `with_key`
boot folder on PYTHONPATH (as the hub's spawner sets them): the lessons pass through the door's
limits, and the door's log names her.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure_footprint import nbval_command  # noqa: E402  (this folder is on sys.path when run as a script)

from lab_backends import learner  # noqa: E402
from lab_backends.client.with_key import BOOT_DIR  # noqa: E402
from lab_backends.measure.door_share import DoorServe  # noqa: E402
from lab_backends.paths import lesson_notebooks  # noqa: E402
from lab_backends.server.admin import CLASS_RESTRICTED  # noqa: E402
from lab_backends.server.triton_server import TritonServer  # noqa: E402

#: What deploy/'s shared Triton keeps behind the admin key (statistics stay open for the lessons).
DEPLOY_RESTRICTED = CLASS_RESTRICTED


@contextlib.contextmanager
def shared_server(door: bool) -> Iterator[dict[str, str]]:
    """The shared server, and the environment a learner's notebook gets for it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
    env.update(LAB_FAST=env.get("LAB_FAST", "1"), PYTHONPATH=str(ROOT))
    if not door:
        # models=None: every model of the repository, as deploy/'s shared server loads them.
        with TritonServer(models=None, target="local", restricted_apis=DEPLOY_RESTRICTED) as shared:
            yield {**env, "TRITON_URL": f"http://{shared.http_url}", "TRITON_GRPC_URL": shared.grpc_url,
                   "TRITON_METRICS_URL": shared.metrics_url}
        return
    secret = learner.new_secret()
    with tempfile.TemporaryDirectory(prefix="shared-door-") as tmp:
        serve = DoorServe(Path(tmp), secret, models=(), restricted=CLASS_RESTRICTED)
        try:
            yield {**env, "TRITON_URL": f"http://{serve.http}", "TRITON_GRPC_URL": serve.grpc,
                   "TRITON_METRICS_URL": serve.metrics, learner.LEARNER_VAR: "ada",
                   learner.TOKEN_VAR: learner.token_for(secret, "ada"),
                   "PYTHONPATH": os.pathsep.join([str(BOOT_DIR), str(ROOT)])}
        finally:
            serve.stop()


def main(paths: list[str]) -> int:
    door = "--door" in paths
    notebooks = [Path(p) for p in paths if p != "--door"] or lesson_notebooks()
    failed = 0
    with shared_server(door) as env:
        print(f"shared server: {env['TRITON_URL']} (no admin key given to the notebooks"
              f"{'; behind the front door, as learner ada' if door else ''})", flush=True)
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
