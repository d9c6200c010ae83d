"""``class measure --sandboxed``: learners replayed each from a class sandbox reach a real server, and leave nothing.

Root only (network namespaces and cgroups), as in CI. One embedded Triton serving ``echo``; two
simulated learners, each in a sandbox of its own (network namespace with the server's ports
forwarded, the class's limits), send two requests each at the recorded pace.
"""

from __future__ import annotations

import os

import pytest

from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.classroom.network import NETNS_DIR, namespace_name
from lab_backends.classroom.sandboxed_replay import SandboxedReplay
from lab_backends.server.triton_server import TritonServer

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and cgroups need root (CI runs as root)")]


def test_sandboxed_learners_are_answered_and_their_sandboxes_removed() -> None:
    with TritonServer(models=["echo"], target="local") as server:
        latencies, errors = SandboxedReplay(LearnerLimits(), start_s=4.0)(server, [(0.5, "echo", 2)], 2)
    assert not errors, errors
    assert len(latencies) == 4 and {model for model, _, _ in latencies} == {"echo"}
    assert all(0 < latency < 10 for _, latency, _ in latencies), latencies
    for i in range(2):
        name = f"lab-measure{i}"
        assert not (NETNS_DIR / namespace_name(name)).exists()
        assert not [g for g in cgroups.learner_groups(name) if g.exists()]
