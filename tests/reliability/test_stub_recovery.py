"""A killed Python stub: Triton hides it, :mod:`lab_backends.server.health` finds it, recovers, and says so.

Measured on 2.51 and checked again here: after a stub dies the model is still READY and every
request fails with ``Stub process '<instance>' is not healthy``; only unload + load brings it back.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.client.recovering import infer_with_recovery
from lab_backends.errors import StubCrashedError
from lab_backends.server import health
from lab_backends.server.processes import SHM_DIR
from lab_backends.server.triton_server import TritonServer

from .conftest import REPOSITORIES

pytestmark = pytest.mark.server

X = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture
def server(rel_server):
    """The shared server; each test must leave every stub alive (checked here)."""
    yield rel_server
    assert health.check_stubs(rel_server) == {}, "a test left a dead stub behind"


def _kill_stub(server: TritonServer, instance: str) -> health.Stub:
    stub = health.stubs(server)[instance]
    os.kill(stub.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while instance in health.stubs(server):
        assert time.monotonic() < deadline, f"stub {stub.pid} survived SIGKILL"
        time.sleep(0.05)
    return stub


def test_crashed_instance_is_read_from_tritons_message():
    assert health.crashed_instance("[500] Stub process 'digits_onnx_0_0' is not healthy.") == "digits_onnx_0_0"
    assert health.crashed_instance("inference request batch-size must be <= 8") is None


def test_healthy_server_has_one_stub_per_instance(server):
    assert health.check_stubs(server) == {}
    live = health.stubs(server)
    assert {"rel_double_0_0", "rel_crash_0_0", "cost_model_0_0"} <= set(live)
    assert all((SHM_DIR / s.shm_region).exists() for s in live.values())
    health.ensure_stubs_healthy(server)  # does not raise


def test_killed_stub_is_detected_recovered_and_explained(server):
    old = _kill_stub(server, "rel_double_0_0")

    # What Triton shows: READY, and every request failing.
    assert server.http_client.is_model_ready("rel_double")
    for protocol in ("grpc", "http"):
        with pytest.raises(InferenceServerException, match="Stub process 'rel_double_0_0' is not healthy"):
            infer(server, "rel_double", {"INPUT0": X}, protocol=protocol)

    # What lab_backends sees.
    assert health.check_stubs(server) == {"rel_double": ["rel_double_0_0"]}
    with pytest.raises(StubCrashedError, match="rel_double_0_0"):
        health.ensure_stubs_healthy(server)
    assert old.shm_region in health.orphan_shm_regions(server)

    messages: list[str] = []
    recovery = health.recover(server, "rel_double", notify=messages.append)
    assert recovery.dead_instances == ["rel_double_0_0"]
    assert recovery.new_stubs["rel_double_0_0"] != old.pid
    assert recovery.removed_shm == [old.shm_region]
    assert not (SHM_DIR / old.shm_region).exists()
    assert messages == [recovery.message]
    assert "'rel_double'" in messages[0] and "reloaded" in messages[0] and "never restarts" in messages[0]

    assert health.check_stubs(server) == {}
    for protocol in ("grpc", "http"):
        np.testing.assert_array_equal(infer(server, "rel_double", {"INPUT0": X}, protocol=protocol)["OUTPUT0"], 2 * X)


def test_infer_with_recovery_recovers_once_and_retries(server):
    _kill_stub(server, "rel_double_0_0")
    messages: list[str] = []
    out = infer_with_recovery(server, "rel_double", {"INPUT0": X}, notify=messages.append)
    np.testing.assert_array_equal(out["OUTPUT0"], 2 * X)
    assert len(messages) == 1 and "Stub process 'rel_double_0_0' is not healthy" in messages[0]
    assert health.check_stubs(server) == {}


def test_model_that_kills_its_own_stub_ends_in_stub_crashed_error(server):
    """The crash is the model's own doing: recovery happens once, then a clear error, no loop."""
    messages: list[str] = []
    with pytest.raises(StubCrashedError, match="kills its own process on this input"):
        infer_with_recovery(server, "rel_crash", {"INPUT0": -(X + 1)}, notify=messages.append)
    assert len(messages) == 1  # recovered exactly once
    recoveries = health.recover_all(server, notify=messages.append)
    assert [r.model for r in recoveries] == ["rel_crash"]
    np.testing.assert_array_equal(infer(server, "rel_crash", {"INPUT0": X})["OUTPUT0"], 2 * X)
    # The other model never noticed.
    np.testing.assert_array_equal(infer(server, "rel_double", {"INPUT0": X})["OUTPUT0"], 2 * X)


def test_stub_inspection_refuses_a_remote_server_with_advice():
    remote = TritonServer(target="remote", url="127.0.0.1:1")
    with pytest.raises(Exception, match="infer_with_recovery"):
        health.stubs(remote)


def test_stop_removes_the_region_of_a_stub_that_died_earlier():
    """A stub killed and never recovered: stopping the server must not leave its region behind."""
    with TritonServer(REPOSITORIES, models=["rel_double"]) as server:
        region = _kill_stub(server, "rel_double_0_0").shm_region
        assert (SHM_DIR / region).exists()
    leaked = Path(SHM_DIR / region)
    exists = leaked.exists()
    leaked.unlink(missing_ok=True)  # never leave it for the next test, whatever the outcome
    assert not exists, f"{leaked} left behind after stop()"
