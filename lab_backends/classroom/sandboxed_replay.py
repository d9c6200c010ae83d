"""Replay N learners' requests each from a class sandbox of its own (``class measure --sandboxed``).

Why: a learner's requests to the shared server now leave their network namespace through two socat
forwarders (``network.py``), and their client runs inside their cgroups (``cgroups.py``). What that
costs a lesson's latency is measured here, beside the plain replay of the same streams on the same
server in the same run (``measure/class_latency.py``). Each simulated learner is one process (the
same replay, ``python -m lab_backends.measure.replay``) in a sandbox made exactly as the spawner
makes a learner's: a network namespace whose only way out is the server's forwarded ports, and the
class's limits. They run as root (no learner accounts needed: limits and namespaces do not depend
on the user), start together at one monotonic instant, and their sandboxes are removed after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.classroom.network import LearnerNetwork, close_network, open_network
from lab_backends.classroom.roster import require_root
from lab_backends.paths import PROJECT_ROOT

#: Time for every learner's interpreter to start before their streams begin together.
START_S = 10.0


class SandboxedReplay:
    """A :data:`lab_backends.measure.class_latency.Replayer` that puts each learner in a sandbox."""

    def __init__(self, limits: LearnerLimits, start_s: float = START_S) -> None:
        require_root("class measure --sandboxed")
        self.limits, self.start_s = limits, start_s

    def __call__(self, server: Any, stream: list, n: int) -> tuple[list[tuple[str, float, float]], list[str]]:
        http, grpc = (int(url.rpartition(":")[2]) for url in (server.http_url, server.grpc_url))
        names = [f"lab-measure{i}" for i in range(n)]
        nets: list[LearnerNetwork] = []
        procs: list[subprocess.Popen] = []
        with tempfile.TemporaryDirectory(prefix="lab-measure-") as tmp:
            stream_file = Path(tmp) / "stream.json"
            stream_file.write_text(json.dumps(stream))
            env = {**os.environ, "TRITON_URL": f"http://127.0.0.1:{http}", "TRITON_GRPC_URL": f"127.0.0.1:{grpc}",
                   "PYTHONPATH": str(PROJECT_ROOT)}
            t0 = time.monotonic() + self.start_s
            try:
                for name in names:
                    groups = cgroups.create(name, self.limits)
                    nets.append(open_network(name, inward=[], outward=[http, grpc]))
                    procs.append(subprocess.Popen(
                        [*cgroups.join_command(groups), *nets[-1].enter(), sys.executable, "-m",
                         "lab_backends.measure.replay", str(stream_file), str(t0)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
                return _collect(procs)
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                for net in nets:
                    close_network(net)
                for name in names:
                    cgroups.remove(name)


def _collect(procs: list[subprocess.Popen]) -> tuple[list[tuple[str, float, float]], list[str]]:
    latencies: list[tuple[str, float, float]] = []
    errors: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            errors.append(f"a sandboxed learner exited {proc.returncode}: {err.strip()[-300:]}")
            continue
        answers = json.loads(out.strip().splitlines()[-1])
        latencies += [tuple(row) for row in answers["latencies"]]
        errors += answers["errors"]
    return latencies, errors
