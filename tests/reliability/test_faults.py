"""The server killed in the middle of a load: the load reports it and ends; a restart carries on.

Kill by PID (``server.pid``) with SIGKILL: no goodbye from the server, the worst case for a
client. Every request must still end in exactly one bucket, the driver must return on its own
(no hung thread), the stubs must not outlive ``stop()``, and the same ``TritonServer`` must
start again and serve a clean load.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from lab_backends.server.processes import alive, group_members
from lab_backends.server.triton_server import TritonServer

from .conftest import REPOSITORIES
from .driver import Target, plan, run_load

pytestmark = [pytest.mark.server, pytest.mark.slow]

PLANNED = 20_000  # far more than can finish before the kill: the kill is mid-load by design
KILL_AFTER_S = 1.5
AFTER_RESTART = 1_000


def _target(server: TritonServer) -> Target:
    return Target(server.grpc_url, server.http_url, {"rel_double": 2.0})


#: Threads a library starts once and keeps for the life of the process (daemon singletons, not a
#: leak of the load): pycares' channel-destroying thread, started the first time aiohttp closes an
#: aiodns resolver (aiodns comes with the `class` extra's JupyterHub, and aiohttp then prefers it).
PROCESS_SINGLETONS = ("(_run_safe_shutdown_loop)",)


def _extra_threads(before: set[threading.Thread], wait_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + wait_s
    while True:
        extra = [t.name for t in threading.enumerate() if t not in before and t.is_alive()
                 and not (t.daemon and t.name.endswith(PROCESS_SINGLETONS))]
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


def test_server_killed_mid_load_then_restarted():
    server = TritonServer(REPOSITORIES, models=["rel_double"])
    server.start()
    try:
        threads_before = set(threading.enumerate())
        victim = server.pid
        stubs = [p for p in group_members(victim) if p != victim]
        killer = threading.Timer(KILL_AFTER_S, os.kill, args=(victim, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        result = run_load(
            _target(server), plan(PLANNED, ["rel_double"]), concurrency=32,
            deadline_s=60, timeout_s=10, stop_after_failures=300,
        )
        elapsed = time.monotonic() - started
        killer.join()
        print(f"\nkill mid-load: {result.summary()}")

        assert result.ok > 0, "the kill came before any request was answered"
        assert result.failed + result.lost > 0, "no request failed: the kill did not land mid-load"
        assert result.sent < PLANNED and result.stopped_early
        assert result.accounted == result.sent  # every request answered or reported, none vanished
        assert result.mismatched == result.duplicated == 0
        assert elapsed < 60
        assert _extra_threads(threads_before) == []
        assert not alive(victim)

        server.stop()
        assert group_members(victim) == [], f"stubs {stubs} outlived the killed server"

        server.start()  # the same object, fresh process and ports
        assert server.pid != victim
        again = run_load(_target(server), plan(AFTER_RESTART, ["rel_double"], first_id=PLANNED), concurrency=32)
        print(f"after restart: {again.summary()}")
        assert (again.ok, again.failed, again.lost, again.mismatched) == (AFTER_RESTART, 0, 0, 0), again.summary()
        assert _extra_threads(threads_before) == []
    finally:
        server.stop()
