"""File descriptors, log size, loads that cannot hang, parent death: each against a real server."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lab_backends.errors import ModelLoadError
from lab_backends.server import limits, logcap, processes
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS, known_good

pytestmark = pytest.mark.server
LOW_SOFT_LIMIT = 1024  # a common desktop default, at which Triton 2.51 stopped serving
IDLE_CONNECTIONS = 1100
LOG_CAP = 256 * 1024


@pytest.fixture(scope="module")
def low_limit_server(tmp_path_factory):
    """A server started from a process whose soft fd limit is 1,024 (raised for the child only)."""
    repo = tmp_path_factory.mktemp("repo")
    for name in ("rel_double",):
        shutil.copytree(TEST_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= IDLE_CONNECTIONS + 100:
        pytest.skip(f"the hard open-file limit ({hard}) leaves no room above {LOW_SOFT_LIMIT}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT_LIMIT, soft), hard))
    os.environ["LAB_MAX_LOG_BYTES"] = str(LOG_CAP)  # read by this server's watchdog only
    try:
        # log_verbose=1 logs every request: a small log storm for test_log_is_capped_while_serving
        server = TritonServer(repo, models=["rel_double"], log_verbose=1).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        del os.environ["LAB_MAX_LOG_BYTES"]
    server.repo = repo
    yield server
    server.stop()


def test_server_soft_fd_limit_is_raised_to_hard(low_limit_server):
    soft, hard = limits.open_files_limit(low_limit_server.pid)
    assert soft == hard == limits.nofile_target() > LOW_SOFT_LIMIT


def test_leaked_idle_connections_do_not_stop_serving(low_limit_server):
    """1,100 connections that never send (as leaked CLOSE-WAIT sockets do) and it still serves."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * IDLE_CONNECTIONS)), hard))
    held = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", low_limit_server.http_port), timeout=5))
        known_good(low_limit_server, "http")
        known_good(low_limit_server, "grpc")
        open_fds = len(os.listdir(f"/proc/{low_limit_server.pid}/fd"))
        assert open_fds > LOW_SOFT_LIMIT, f"the server holds only {open_fds} descriptors: nothing was tested"
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    known_good(low_limit_server, "http")


def test_load_of_a_model_without_its_file_fails_fast_and_names_it(low_limit_server):
    model_file = low_limit_server.repo / "rel_double" / "1" / "model.py"
    saved = model_file.read_bytes()
    model_file.unlink()
    started = time.monotonic()
    try:
        with pytest.raises(ModelLoadError, match="Python model file not found") as caught:
            low_limit_server.load_model("rel_double")
    finally:
        model_file.write_bytes(saved)
    assert caught.value.model == "rel_double" and time.monotonic() - started < 10
    known_good(low_limit_server)  # the loaded version was never touched


def test_log_is_capped_while_serving(low_limit_server):
    """The watchdog rotates a live server's log past its cap (verbose logging of 600 requests)."""
    from lab_backends.client.infer import infer

    x = np.zeros((1, 16), dtype=np.float32)
    rotated = low_limit_server.log_path.with_name("tritonserver.log.1")
    for _ in range(60):
        for _ in range(10):
            infer(low_limit_server, "rel_double", {"INPUT0": x}, protocol="http")
        if rotated.exists():
            break
    assert poll(rotated.exists, bool, 10, 0.2), "the log was never rotated"
    assert low_limit_server.log_path.stat().st_size < 4 * LOG_CAP
    known_good(low_limit_server)


def test_a_hanging_load_is_bounded_and_explained(low_limit_server):
    # Last test on this server: the abandoned load keeps sleeping in initialize() for 60 s. Run
    # before the log test, that test's 600 verbose-logged HTTP requests once took 60 s instead of
    # 1 s (not reproduced without verbose logging; not investigated further).
    slow = low_limit_server.repo / "rel_slow_init"
    shutil.copytree(low_limit_server.repo / "rel_double", slow)
    config = (slow / "config.pbtxt").read_text().replace('"rel_double"', '"rel_slow_init"')
    (slow / "config.pbtxt").write_text(config)
    code = (slow / "1" / "model.py").read_text()
    (slow / "1" / "model.py").write_text(code.replace("class TritonPythonModel:", "class TritonPythonModel:\n"
                                                      "    def initialize(self, args):\n"
                                                      "        import time; time.sleep(60)\n", 1))
    low_limit_server.load_timeout_s = 3
    started = time.monotonic()
    try:
        with pytest.raises(ModelLoadError, match=r"did not finish within 3 s") as caught:
            low_limit_server.load_model("rel_slow_init")
    finally:
        del low_limit_server.load_timeout_s
    assert caught.value.model == "rel_slow_init" and time.monotonic() - started < 30
    known_good(low_limit_server)


def test_log_is_capped(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_bytes(b"x" * 900 + b"LAST")
    assert not logcap.cap_log(log, max_bytes=1000, keep_bytes=100)
    log.write_bytes(b"x" * 1900 + b"LAST")
    assert logcap.cap_log(log, max_bytes=1000, keep_bytes=100)
    assert log.stat().st_size < 200 and b"tritonserver.log.1" in log.read_bytes()
    assert (tmp_path / "tritonserver.log.1").read_bytes().endswith(b"LAST")


_OWNER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from lab_backends.server.triton_server import TritonServer
s = TritonServer(models=["echo"]).start()
print(s.pid, s._target._watchdog.pid, flush=True)  # the local target owns the watchdog
time.sleep(600)
"""


def test_server_dies_with_its_owner_and_watchdog(tmp_path):
    """kill -9 of the owner and its watchdog at once: PR_SET_PDEATHSIG stops tritonserver (by PID)."""
    root = str(Path(__file__).resolve().parents[2])
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, root], stdout=subprocess.PIPE, text=True, cwd=root)
    server_pid = watchdog_pid = 0
    try:
        line = owner.stdout.readline()
        assert line, "the owner process did not start a server"
        server_pid, watchdog_pid = map(int, line.split())
        stubs = processes.children(server_pid)
        os.kill(watchdog_pid, signal.SIGKILL)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        gone = poll(lambda: [p for p in [server_pid, *stubs] if processes.alive(p)], lambda left: not left, 30, 0.2)
        assert not gone, f"still running after their owner died: {gone}"
    finally:
        for pid in (server_pid, watchdog_pid):
            if pid and processes.alive(pid):
                processes.stop_group(pid, 5.0) if pid == server_pid else os.kill(pid, signal.SIGKILL)
        if owner.poll() is None:
            owner.kill()
