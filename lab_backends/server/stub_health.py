"""Python stubs that die under ``lab-backends serve --restart``: found within seconds, their models reloaded.

Why: one learner's request can kill a Python model's stub (a binary request whose header shape wraps
64 bits, ``"shape":[4611686018427387905]`` with ``binary_data_size: 4``, to ``echo``: docs/reliability.md).
Triton 2.51 never starts that stub again and keeps calling the model READY, so every later request to
it, from every learner, fails with ``Stub process '<model>_0_0' is not healthy`` until someone reloads
it (a class saw 786 s of that). tritonserver itself lives on, so :mod:`lab_backends.server.crash`'s
supervision has nothing to restart. What python_backend and core do at r24.10:

* The stub is a direct child of tritonserver: ``StubLauncher::Launch`` (python_backend
  ``src/stub_launcher.cc`` L331-L420) forks and runs ``bash -c "exec <stub> <model.py> <shm region>
  <size> <growth> <parent pid> <backend dir> <ipc handle> <instance name> <runtime dir>"``
  (L378-L381, the instance name from L337), so its command line names its instance.
* Nothing watches it. The backend learns of the death only from a request: ``ReceiveMessageFromStub``
  (L728-L779) waits 1 s at a time for the answer and, when the stub did not set
  ``ipc_control->stub_health`` meanwhile, returns ``Stub process '<instance>' is not healthy.``;
  ``TRITONBACKEND_ModelInstanceExecute`` (``src/python_be.cc`` L2281-L2378) answers every request of the
  batch with that error and returns. Its comment "If restart is equal to true, it indicates that the
  stub process is unhealthy and needs a restart" (L2291-L2293) is all that is left of the restart:
  r24.05 killed and relaunched the stub right there (python_be.cc L2446-L2470 at r24.05, "Stub process
  is unhealthy and it will be restarted."); commit 27f04d1 ("Add support for response sender in the
  default mode (#364)", June 2024, first in r24.06) removed it. No other path relaunches a stub
  (``git grep -i restart r24.10 -- src``: only that comment and two about shared memory).
* Nothing reaps it either: ``waitpid`` runs only in ``WaitForStubProcess`` (L782-L796), from
  ``TerminateStub`` when the instance is finalized, so the dead stub stays a zombie until an unload.
* READY is the model's lifecycle state, not its health: core ``InferenceServer::ModelIsReady``
  (``src/server.cc`` L450-L472 at r24.10) answers ``state == READY``; the backend API has no call that
  reports an instance unhealthy.

How, without sending anything into a learner's model: :class:`StubWatch` reads the stubs of the
server's process group with psutil (:func:`health.stubs`, zombies count as gone) once a second. When a
stub that was alive at the previous look is gone (or the server is new, or every
:data:`FULL_CHECK_S` for a stub that died before it was ever seen), it asks the server which READY
Python models have fewer live stubs than their config's instance groups ask for
(:func:`short_of_stubs`: the repository index and the models' configs, metadata only), looks again
:data:`CONFIRM_S` later (an unload or a reload in progress removes stubs legitimately; a READY model
short of stubs twice is dead) and reloads each such model through the admin key
(:func:`health.recover`: unload + load, the dead stub's ``/dev/shm`` region removed). Stubs are
counted per instance group, not matched by name: a load that changes only the instance groups updates
the instances in place (core ``TritonModel::UpdateInstanceGroup``, ``src/backend_model.cc``
L237-L272 at r24.10), so after a count of 2 went back to 1 the survivor was ``echo_0_1`` (measured),
not the ``echo_0_0`` a fresh load would name.
Measured here (2 cores shared with other test runs): ``echo`` answered again 3.1 s after its stub was
SIGKILLed and 2.1 s after the wrapping request's own 500 (4.8 s and 3.0 s beside two busy loops; 4.8 s
behind the class's front door, as root); a reload itself took 1.4-3.7 s
(tests/test_stub_health.py).

Limits: a stub that is alive but stuck is not seen (only a gone one is); a model loaded with a config
override comes back with its ``config.pbtxt`` (unload + load); while a model reloads, the supervise
loop waits for it (a few seconds), so a server crash meanwhile is seen that much later.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lab_backends.server import health
from lab_backends.server.crash import crashed, raise_if_dying

#: How often the stubs are looked at (psutil only: no request reaches the server).
LOOK_EVERY_S = 1.0
#: How long after a first sighting a missing stub is looked for again before its model is reloaded.
CONFIRM_S = 0.5
#: A full check (metadata requests) at least this often, for a stub that died before it was ever seen.
FULL_CHECK_S = 30.0
#: After a check or a reload that failed, the next full check comes this much later (no reload loop).
RETRY_S = 5.0


@dataclass
class StubWatch:
    """Heal dead stubs of one running server; call :meth:`tick` often (``crash.supervise`` does, every 0.2 s).

    ``recoveries`` keeps what was healed, for whoever wants to count it.
    """

    server: Any
    report: Callable[[str], None] = health.to_stderr  # where ``serve`` reports
    look_every_s: float = LOOK_EVERY_S
    recoveries: list[health.Recovery] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _server_pid: int | None = None
    _next_look: float = 0.0
    _next_full: float = 0.0

    def tick(self) -> None:
        """Look at the stubs if it is time; reload the models whose stubs died. Never raises."""
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + self.look_every_s
        try:
            self._look(now)
        except Exception as exc:  # noqa: BLE001 - healing must never end supervision
            if crashed(self.server) is None and self.server.is_running():
                self.report(f"stub health: {type(exc).__name__}: {exc} (looking again in {RETRY_S:.0f} s)")
            self._seen = set()  # look again from scratch: a full check, not before RETRY_S
            self._next_full = now + RETRY_S

    def _look(self, now: float) -> None:
        if self.server.pid != self._server_pid:  # a new server (restarted): nothing seen yet
            self._server_pid, self._seen, self._next_full = self.server.pid, set(), 0.0
        live = set(health.stubs(self.server))
        vanished = self._seen - live
        self._seen = live
        if not vanished and now < self._next_full:
            return
        self._next_full = now + FULL_CHECK_S
        # Stubs also go when tritonserver dies: a server on its way out (its log's last line "Signal (N)
        # received.") is waited for and raises ServerCrashed, so supervise restarts it; nothing is reloaded.
        raise_if_dying(self.server)
        short = short_of_stubs(self.server)
        if not short:
            return
        time.sleep(CONFIRM_S)
        again = short_of_stubs(self.server)
        for model in sorted(set(short) & set(again)):
            self._heal(model, again[model])
        self._seen = set(health.stubs(self.server))

    def _heal(self, model: str, groups: list[str]) -> None:
        self.report(f"stub health: the Python stub of model '{model}' died ({'; '.join(groups)}) and Triton 2.51 "
                    "never restarts it (it still says READY); reloading the model")
        recovery = health.recover(self.server, model, notify=None)
        self.recoveries.append(recovery)
        pids = ", ".join(f"{name} pid {pid}" for name, pid in sorted(recovery.new_stubs.items()))
        self.report(f"stub health: model '{model}' reloaded in {recovery.seconds:.1f} s and serves again "
                    f"({pids}); if it keeps dying, a request or its model.py kills it (log: {self.server.log_path})")


def short_of_stubs(server: Any) -> dict[str, list[str]]:
    """``{model: ["<group>: 0 of 1 stubs alive", ...]}`` for READY Python models lacking live stubs.

    A model unloaded between the index and its config is skipped: it is not READY any more.
    """
    live = set(health.stubs(server))
    short: dict[str, list[str]] = {}
    for model in sorted({e["name"] for e in server.repository_index() if e.get("state") == "READY"}):
        try:
            config = server.model_config(model)
        except Exception:  # noqa: BLE001 - gone or reloading meanwhile: not READY, not ours to judge
            continue
        if config.backend != "python":
            continue
        for index, group in enumerate(config.instance_group):
            base = group.name or f"{model}_{index}"
            wanted = max(group.count, 1) * max(len(group.gpus), 1)
            alive = sum(1 for name in live if re.fullmatch(re.escape(base) + r"_\d+", name))
            if alive < wanted:
                short.setdefault(model, []).append(f"{base}: {alive} of {wanted} stubs alive")
    return short
