"""Keeps the front door's validating gateway alive under ``serve --restart``.

Why: the gateway (:mod:`lab_backends.server.door_gateway`) is a process of its own between nginx and
tritonserver. If it dies (a bug a learner's request finds, the OOM killer), nginx answers 502 to every
request of every learner, while tritonserver itself is fine, until the class is started again.
``--restart`` promises a server that comes back, so the gateway comes back too: on the same ports
(nginx's upstreams name them), after :data:`FIRST_DELAY_S`, doubling after each start that fails up to
:data:`MAX_DELAY_S`, never giving up, as tritonserver's own supervisor does
(:func:`lab_backends.server.crash.supervise`).

The watch knows the gateway only by two calls (its exit code, a restart), so it is tested on any
process and front_door.py keeps the gateway itself.
"""

from __future__ import annotations

import threading
from typing import Callable

from lab_backends.errors import LabBackendsError

#: Seconds between two looks at the gateway.
PERIOD_S = 0.5
#: Seconds before the first start again, doubled after each failed start, up to MAX_DELAY_S.
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0


class GatewayWatch:
    """A thread that starts the gateway again whenever ``exit_code()`` says it exited; ``restart()`` starts
    it (raising :class:`LabBackendsError` when it could not) and says where it now runs; ``report`` gets
    one line per event (serve's stderr)."""

    def __init__(self, exit_code: Callable[[], int | None], restart: Callable[[], str],
                 report: Callable[[str], None]) -> None:
        self.exit_code, self.restart, self.report = exit_code, restart, report
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-watch", daemon=True)

    def start(self) -> "GatewayWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the gateway is stopped on purpose); waits for a restart under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _run(self) -> None:
        delay = FIRST_DELAY_S
        while not self._stop.wait(PERIOD_S):
            code = self.exit_code()
            if code is None:
                continue
            self.report(f"the front door's gateway exited ({code}); starting it again in {delay:g} s")
            if self._stop.wait(delay):
                return
            try:
                where = self.restart()
            except LabBackendsError as exc:
                delay = min(2 * delay, MAX_DELAY_S)
                self.report(f"the front door's gateway did not start again: {exc}")
                continue
            self.restarts += 1
            delay = FIRST_DELAY_S
            self.report(f"the front door's gateway is back: {where}")
