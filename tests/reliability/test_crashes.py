"""Requests that kill Triton 2.51 (upstream defects): detected, explained, recovered from.

Each test sends the crasher, then asserts that the server really died (``upstream``: the day an
upgraded Triton survives it, the assertion fails and the workaround can go), that the next call
raises ``ServerCrashed`` naming the signal, and that ``restart()`` serves again on the same ports.
The fuzzing test (test_fuzz.py) excludes these requests by the names in ``CRASHERS``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lab_backends import rest
from lab_backends.errors import ServerCrashed
from lab_backends.server import health
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll
from tests.reliability.conftest import REPOSITORIES, known_good

pytestmark = pytest.mark.server

#: name -> (content type, body) of each request that kills tritonserver itself.
NESTED = b'{"inputs":' + b"[" * 200_000
HUGE_SHAPE = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1099511627776], "datatype": "FP32", "data": [1.0]}]}
).encode()
#: curl's default for --data: Triton 2.51 segfaults on such a body from about 4 MiB, on any path; its
#: own sources at r24.10 handle no form encoding (src/http_server.cc), so the crash is below them, in
#: the HTTP library (3 MiB was answered; 64 MiB as JSON or octet-stream get a clean 500).
FORM_ENCODED = b"a=" + b"x" * (4 << 20)
CRASHERS = {
    "form_encoded_4mib": ("application/x-www-form-urlencoded", FORM_ENCODED),
    "nested_json": ("application/json", NESTED),
    "nested_json_text_plain": ("text/plain", NESTED),
    "huge_json_shape": ("application/json", HUGE_SHAPE),
}


def binary_overflow_request(shape: list[int]) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request whose shape's byte size overflows 64 bits, with 4 bytes of data."""
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    ).encode()
    return header + np.float32(1).tobytes(), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


@pytest.fixture(scope="module")
def crash_server():
    from lab_backends.server.cbackend import build_all

    build_all()  # c_scale must carry the overflow check of lab_backend_util.h (rebuilt only if stale)
    with TritonServer(REPOSITORIES, models=["rel_double", "echo", "c_scale"]) as server:
        yield server


def _supervise_in_background(server: TritonServer, reports: list[str], outcome: list[int],
                             max_per_minute: int | None = 1, should_stop: Any = lambda: False) -> Any:
    """``supervise`` (bounded at one crash a minute unless told), on a thread: its reports and return
    value land in the lists."""
    import threading

    from lab_backends.server.crash import supervise

    runner = threading.Thread(target=lambda: outcome.append(
        supervise(server, max_per_minute=max_per_minute, report=reports.append, backoff_s=0.1,
                  should_stop=should_stop)), daemon=True)
    runner.start()
    return runner


@pytest.fixture(autouse=True)
def _serving_after(crash_server):
    """Whatever a test did to the shared server, the next one finds it serving: a failed assertion
    in one crash test must not become a ConnectionRefused in the next."""
    yield
    if not crash_server.is_ready():
        crash_server.restart()


def _post(server: TritonServer, model: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes] | None:
    try:
        return rest.request(f"http://{server.http_url}/v2/models/{model}/infer", "POST", body, headers, 15)
    except OSError:
        return None  # the server died mid-request


@pytest.mark.upstream
@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_crasher_is_detected_explained_and_restarted(crash_server, name):
    content_type, body = CRASHERS[name]
    ports = (crash_server.http_port, crash_server.grpc_port, crash_server.metrics_port)
    old_pid = crash_server.pid
    answer = _post(crash_server, "rel_double", body, {"Content-Type": content_type})
    code = poll(crash_server.process.poll, lambda c: c is not None, 10, 0.1)
    assert code is not None, (
        f"UPSTREAM FIXED? tritonserver survived {name!r} (answered {answer!r}): drop this crasher from "
        "docs/reliability.md and the fuzzer's exclusions"
    )
    with pytest.raises(ServerCrashed) as caught:
        crash_server.grpc_client  # the next call of any kind
    message = str(caught.value)
    assert caught.value.returncode == code < 0
    assert ("SIGSEGV" if code == -11 else "SIGABRT") in message and "restart()" in message
    if name == "huge_json_shape":
        assert "bad_alloc" in caught.value.log_tail
    crash_server.restart()
    assert crash_server.pid != old_pid
    assert (crash_server.http_port, crash_server.grpc_port, crash_server.metrics_port) == ports
    known_good(crash_server, "grpc")
    known_good(crash_server, "http")


#: A model whose initialize() outlasts any test: a load of it is still waiting when the server is killed.
SLOW_LOAD = b"import time\n\n\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(120)\n\n" \
    b"    def execute(self, requests):\n        return []\n"


def test_a_load_the_server_dies_under_raises_server_crashed_not_a_closed_connection(crash_server):
    """The server is killed (SIGSEGV, through Triton's own handler) while a load waits on it: the load names the
    crash, as stop 44's audit could not (it said only "HTTPConnectionClosed: connection closed")."""
    config = json.dumps({"name": "rel_slow_load", "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]})
    killer = threading.Timer(3.0, os.kill, (crash_server.pid, signal.SIGSEGV))
    killer.start()
    try:
        with pytest.raises(ServerCrashed, match=r"killed by signal 11 \(SIGSEGV\).*Signal \(11\) received"):
            crash_server.load_model("rel_slow_load", config=config, files={"file:1/model.py": SLOW_LOAD})
    finally:
        killer.cancel()


@pytest.mark.upstream
def test_binary_shape_overflow_kills_a_python_stub(crash_server):
    """The server survives, the echo stub dies (numpy: "array is too big"); health recovers it."""
    body, headers = binary_overflow_request([4611686018427387905])
    answer = _post(crash_server, "echo", body, headers)
    assert answer is not None and answer[0] >= 500, f"UPSTREAM FIXED? echo answered {answer!r}"
    assert "not healthy" in answer[1].decode()
    dead = poll(lambda: health.check_stubs(crash_server), bool, 10, 0.2)
    assert "echo" in dead, f"the echo stub did not die: {dead}"
    recovery = health.recover(crash_server, "echo")
    assert "echo" in recovery.message
    x = np.arange(5, dtype=np.float32)
    from lab_backends.client.infer import infer

    np.testing.assert_array_equal(infer(crash_server, "echo", {"INPUT0": x})["OUTPUT0"], x)


def test_c_helper_refuses_an_overflowing_shape(crash_server):
    """Our own C backend (lab_get_input) checks the multiplication: a per-request 400-class error, no crash."""
    body, headers = binary_overflow_request([1, 4611686018427387905])
    answer = _post(crash_server, "c_scale", body, headers)
    assert crash_server.process.poll() is None, "c_scale crashed the server"
    assert answer is not None and 400 <= answer[0] < 600
    assert "overflow" in answer[1].decode().lower()
    known_good(crash_server)


@pytest.mark.upstream
def test_supervisor_restarts_then_gives_up_when_crashes_repeat(crash_server):
    """``serve --restart``'s loop: one crash a minute is restarted, a second one is too many (bound 1)."""
    reports: list[str] = []
    outcome: list[int] = []
    runner = _supervise_in_background(crash_server, reports, outcome)
    for round_ in range(2):
        pid = crash_server.pid
        _post(crash_server, "rel_double", NESTED, {"Content-Type": "text/plain"})
        if round_ == 0:
            # Wait for the supervisor's own "restarted", not only for readiness: crashing the new
            # server while restart() still waits for it is the other path (a failed restart).
            assert poll(lambda: any(r.startswith("restarted") for r in reports), bool, 60, 0.2), reports
            assert crash_server.pid != pid
            known_good(crash_server)
    runner.join(timeout=60)
    assert outcome == [1], reports
    assert sum("SIGSEGV" in r for r in reports) == 2 and sum(r.startswith("restarted") for r in reports) == 1
    assert "not restarting again" in reports[-1]
    crash_server.restart()  # leave the module's server serving
    known_good(crash_server)


def test_unbounded_supervisor_brings_the_server_back_after_five_kills_in_a_minute(crash_server):
    """``serve --restart``'s default (no bound): five deaths in a row, each followed by a server ready on
    the same ports; the backoff doubles (0.1 s here, 1 s in ``serve``) and supervision carries on."""
    import os
    import signal
    import threading

    reports: list[str] = []
    outcome: list[int] = []
    done = threading.Event()
    ports = (crash_server.http_port, crash_server.grpc_port, crash_server.metrics_port)
    runner = _supervise_in_background(crash_server, reports, outcome, max_per_minute=None, should_stop=done.is_set)
    try:
        for kill in range(1, 6):
            pid = crash_server.pid
            os.kill(pid, signal.SIGKILL)
            assert poll(lambda: sum(r.startswith("restarted") for r in reports) == kill, bool, 60, 0.1), reports
            assert crash_server.pid != pid and crash_server.is_ready()
            assert (crash_server.http_port, crash_server.grpc_port, crash_server.metrics_port) == ports
        # "restarting in 0.4 s (3 crash(es) in the last minute)": the wait doubles with each crash counted
        waits = [(float(r.split()[2]), int(r.split("(")[1].split()[0]))
                 for r in reports if r.startswith("restarting in")]
        assert len(waits) == 5 and all(wait == pytest.approx(0.1 * 2 ** (n - 1)) for wait, n in waits), reports
        assert waits[-1][1] > 1, reports  # the kills came within a minute of each other
        assert not any("not restarting again" in r for r in reports), reports
    finally:
        done.set()
        runner.join(timeout=30)
    assert outcome == [0], reports
    known_good(crash_server)


def test_supervisor_counts_a_failed_restart_against_the_bound(crash_server):
    """A restart that fails (here: the dead server's HTTP port was taken meanwhile; a server that
    dies again before it is ready takes the same path) is one more failure for the bound, not an
    exception that ends supervision with a traceback."""
    import os
    import signal
    import socket

    reports: list[str] = []
    outcome: list[int] = []
    port = crash_server.http_port
    squatter = socket.socket()
    try:
        os.kill(crash_server.pid, signal.SIGKILL)  # a real death; the supervisor sees it on its next look
        assert poll(lambda: crash_server.process.poll() is not None, bool, 10, 0.05)
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        _supervise_in_background(crash_server, reports, outcome).join(timeout=120)
    finally:
        squatter.close()
    assert outcome == [1], reports
    assert any(r.startswith("the restart failed") and "already in use" in r for r in reports), reports
    assert "not restarting again" in reports[-1]
    crash_server.restart()  # the port is free again: leave the module's server serving
    known_good(crash_server)


@pytest.mark.upstream
def test_big_echo_memory_is_held_until_a_reload(crash_server):
    """Not a crash, a hold (upstream): the Python backend's shm pool only grows; a reload frees it."""
    from lab_backends.client.infer import infer
    from lab_backends.server import processes
    from lab_backends.server.loading import release_memory

    def held_mib() -> float:
        pids = [crash_server.pid, *processes.children(crash_server.pid)]
        regions = [Path("/dev/shm") / r for r in processes.shm_regions(pids)]
        return sum(r.stat().st_size for r in regions if r.exists()) / 2**20

    x = np.ones(10_000_000, dtype=np.float32)  # 40 MB each way
    before = held_mib()
    assert infer(crash_server, "echo", {"INPUT0": x}, protocol="http")["OUTPUT0"].shape == x.shape
    grown = held_mib()
    assert grown > before + 40, f"UPSTREAM FIXED? the shm pool did not grow: {before:.0f} -> {grown:.0f} MiB"
    release_memory(crash_server, "echo")
    assert poll(held_mib, lambda mib: mib < before + 8, 10, 0.2) < before + 8
