"""server/gateway_watch.py: the watch that starts the front door's gateway again (``serve --restart``), on a real
process. The door's own test kills the real gateway (tests/reliability/test_door_validation.py); here the branch
a real gateway takes only when its port is taken or the machine is slow, a start that fails, is forced."""

from __future__ import annotations

import subprocess
import sys
import time

from lab_backends.errors import FrontDoorError
from lab_backends.server import gateway_watch
from lab_backends.server.gateway_watch import GatewayWatch
from lab_backends.waiting import poll


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_dead_process_is_started_again_after_a_failed_start_with_the_delay_doubled(monkeypatch) -> None:
    monkeypatch.setattr(gateway_watch, "PERIOD_S", 0.02)
    monkeypatch.setattr(gateway_watch, "FIRST_DELAY_S", 0.05)
    procs, said, tries = [_sleeper()], [], []

    def restart() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise FrontDoorError("port 8001 is taken")
        procs.append(_sleeper())
        return f"pid {procs[-1].pid}"

    def report(line: str) -> None:
        if "is back" in line:
            time.sleep(0.3)  # forces what a busy machine may do: the watch counted the restart, its line comes later
        said.append(line)

    watch = GatewayWatch(lambda: procs[-1].poll(), restart, report).start()
    try:
        assert poll(lambda: said, bool, 0.3, 0.02) == []  # a live process: nothing said for 0.3 s
        procs[0].kill()
        # Wait for the last line, not for the count: the watch counts a restart before it reports it.
        poll(lambda: len(said), lambda n: n >= 4, 10, 0.02)
        assert watch.restarts == 1 and len(tries) == 2 and procs[-1].poll() is None, said
        assert said[0] == "the front door's gateway exited (-9); starting it again in 0.05 s"
        assert said[1] == "the front door's gateway did not start again: port 8001 is taken"
        assert said[2] == "the front door's gateway exited (-9); starting it again in 0.1 s"  # doubled
        assert said[3] == f"the front door's gateway is back: pid {procs[-1].pid}"
    finally:
        watch.stop()
        for proc in procs:
            proc.kill()
            proc.wait()
