"""Crashed Python backend stubs: detect them, recover the model, and tell the learner.

Each instance of a Python-backend model runs ``model.py`` in its own *stub* process. When a stub
dies (a segfault in a native library, the OOM killer, ``os._exit`` in model code, a stray
``kill -9``), Triton 2.51 never starts it again. Worse, it keeps reporting the model READY while
every request fails with ``Stub process '<model>_0_0' is not healthy`` (measured). A learner sees
a model that "is ready" and "does not work", which is exactly the confusion this module removes:

* :func:`check_stubs` compares the instances each READY Python model should have (from its
  config) with the stub processes alive in the server's process group;
* :func:`recover` unloads and loads the model through the restricted model-repository API (the
  only thing that brings a stub back), removes the dead stub's ``/dev/shm`` region that Triton
  leaves behind, and says what happened;
* :func:`lab_backends.client.recovering.infer_with_recovery` (client layer) wraps one inference:
  on a stub crash it recovers once, tells the
  learner, and retries; if that does not help it raises :class:`StubCrashedError`.

Process inspection needs the ``local`` target (it reads the server's processes with psutil, through
:mod:`lab_backends.server.processes`); the error-message path
(:func:`crashed_instance`, ``infer_with_recovery``) works against any target.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from lab_backends.errors import LabBackendsError, StubCrashedError
from lab_backends.server.bundle import STUB_NAME
from lab_backends.server.processes import SHM_DIR, SHM_PREFIX, command_line, group_members, mapped_files, remove_shm
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

#: Triton's words for a request that reached an instance whose stub is gone (2.51).
_STUB_UNHEALTHY = re.compile(r"Stub process '([^']+)' is not healthy")
#: ``<group name>_<k>``, where an unnamed group is ``<model>_<group index>``.
_INSTANCE_SUFFIX = re.compile(r"^(?P<model>.+)_\d+_\d+$")

Notify = Callable[[str], None]


def to_stderr(message: str) -> None:
    """Default notifier: stderr shows up in a notebook cell and in a terminal alike."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Stub:
    """One live stub process of a local server."""

    pid: int
    instance: str
    model_file: Path
    shm_region: str


@dataclass
class Recovery:
    """What :func:`recover` did, in numbers a learner (or a test) can check."""

    model: str
    dead_instances: list[str]
    seconds: float
    new_stubs: dict[str, int] = field(default_factory=dict)
    removed_shm: list[str] = field(default_factory=list)
    trigger: str = ""

    @property
    def message(self) -> str:
        """The explanation shown to the learner."""
        if not self.dead_instances and not self.trigger:
            return (
                f"lab_backends: model '{self.model}' was reloaded (unload + load) in {self.seconds:.1f} s; "
                "all of its stub processes were alive, so nothing had crashed."
            )
        dead = ", ".join(self.dead_instances) or "an instance"
        seen = f" (request failed with: {self.trigger})" if self.trigger else ""
        pids = ", ".join(f"{name} pid {pid}" for name, pid in sorted(self.new_stubs.items()))
        return (
            f"lab_backends: the Python stub process of model '{self.model}' ({dead}) had died{seen}. "
            "Triton never restarts a stub by itself and kept reporting the model READY while every "
            f"request to it failed. The model was reloaded (unload + load) in {self.seconds:.1f} s and "
            f"serves again{' with ' + pids if pids else ''}. If this happens again, something in its "
            "model.py kills the process (a crash in a native library, running out of memory, "
            "os._exit): look at the server log (server.log_text())."
        )


# ---------------------------------------------------------------------------- processes
def _require_local(server: RunningServer) -> int:
    pid = getattr(server, "pid", None)
    if getattr(server, "target", "local") != "local" or pid is None:
        raise LabBackendsError(
            "stub processes can only be inspected for a server started here (target 'local'); for a "
            "remote or docker server use infer_with_recovery(), which recognises a crashed stub by "
            "Triton's error message"
        )
    return pid


def stubs(server: RunningServer) -> dict[str, Stub]:
    """Live stub processes of a local server, by instance name (e.g. ``cost_model_0_0``).

    The stub's command line (measured on 2.51) is ``stub MODEL_FILE SHM_REGION SIZE GROWTH
    PARENT_PID BACKEND_DIR IPC_HANDLE INSTANCE_NAME RUNTIME``; only the parts we rely on are read.
    """
    found: dict[str, Stub] = {}
    for pid in group_members(_require_local(server)):
        args = command_line(pid)
        if len(args) < 9 or not args[0].endswith(STUB_NAME):
            continue
        region = next((a for a in args if a.startswith(SHM_PREFIX)), "")
        found[args[8]] = Stub(pid=pid, instance=args[8], model_file=Path(args[1]), shm_region=region)
    return found


def mapped_shm_regions(server: RunningServer) -> set[str]:
    """Stub shared-memory regions the server process has mapped (one per instance it created)."""
    pattern = re.compile(re.escape(SHM_PREFIX) + r"[\w-]+")
    found = {m.group(0) for path in mapped_files(_require_local(server)) for m in pattern.finditer(path)}
    # A region whose file was already removed is still mapped: nothing left to clean.
    return {name for name in found if (SHM_DIR / name).exists()}


def orphan_shm_regions(server: RunningServer) -> set[str]:
    """Regions still mapped by the server but owned by no live stub: left by stubs that died."""
    owned = {stub.shm_region for stub in stubs(server).values()}
    return mapped_shm_regions(server) - owned


# ---------------------------------------------------------------------------- models
def expected_instances(server: RunningServer, model: str) -> list[str]:
    """Instance names a loaded Python model should have, from the server's (normalized) config.

    Empty for models that run no stub (ensembles, other backends).
    """
    config = server.model_config(model)
    if config.backend != "python":
        return []
    names = []
    for index, group in enumerate(config.instance_group):
        base = group.name or f"{model}_{index}"
        count = max(group.count, 1) * max(len(group.gpus), 1)
        names += [f"{base}_{k}" for k in range(count)]
    return names or [f"{model}_0_0"]


def _ready_models(server: RunningServer) -> list[str]:
    return sorted({e["name"] for e in server.repository_index() if e.get("state") == "READY"})


def check_stubs(server: RunningServer, models: Iterable[str] | None = None) -> dict[str, list[str]]:
    """``{model: [dead instance names]}`` for READY Python models whose stubs are gone.

    An empty dict means every stub that should run does. Triton itself would call all of these
    models READY.
    """
    live = stubs(server)
    dead: dict[str, list[str]] = {}
    for model in models if models is not None else _ready_models(server):
        missing = [name for name in expected_instances(server, model) if name not in live]
        if missing:
            dead[model] = missing
    return dead


def ensure_stubs_healthy(server: RunningServer, models: Iterable[str] | None = None) -> None:
    """Raise :class:`StubCrashedError` naming every dead stub (without recovering anything)."""
    dead = check_stubs(server, models)
    if dead:
        listing = "; ".join(f"{m}: {', '.join(names)}" for m, names in sorted(dead.items()))
        raise StubCrashedError(
            f"Python stub process(es) died: {listing}. Triton still reports these models READY but "
            "every request to them fails. Fix: lab_backends.server.health.recover(server, model) reloads a "
            "model (or restart the server)."
        )


def crashed_instance(error: BaseException | str) -> str | None:
    """The instance name in Triton's ``Stub process '<instance>' is not healthy`` error, if any."""
    match = _STUB_UNHEALTHY.search(str(error))
    return match.group(1) if match else None


def model_of_instance(server: RunningServer, instance: str) -> str:
    """Which model an instance belongs to: from the live configs when possible, else by its name."""
    try:
        for model in _ready_models(server):
            if instance in expected_instances(server, model):
                return model
    except Exception:  # noqa: BLE001 - fall back to the naming rule below
        pass
    match = _INSTANCE_SUFFIX.match(instance)
    return match.group("model") if match else instance


# ---------------------------------------------------------------------------- recovery
def _wait_for_stubs(server: RunningServer, model: str, deadline: float) -> dict[str, int]:
    wanted = expected_instances(server, model)
    live = poll(lambda: stubs(server), lambda seen: all(name in seen for name in wanted),
                max(0.0, deadline - time.monotonic()))
    if not all(name in live for name in wanted):
        raise StubCrashedError(
            f"model '{model}' was reloaded but its stub(s) {', '.join(n for n in wanted if n not in live)} "
            "did not come back; its model.py probably crashes during initialize(). Look at "
            "server.log_text() and restart the server."
        )
    return {name: live[name].pid for name in wanted}


def recover(
    server: RunningServer,
    model: str,
    notify: Notify | None = to_stderr,
    timeout_s: float = 120.0,
    trigger: str = "",
) -> Recovery:
    """Bring a model with a dead stub back: unload, load, wait for its stubs; then say so.

    Unload + load is the only cure (Triton 2.51 has no stub restart). The load goes through the
    restricted model-repository API, so the server's admin key is used (``server.load_model``).
    The dead stub's ``/dev/shm`` region is removed once no live stub owns it, because Triton never
    removes it and it would outlive the server.
    """
    started = time.monotonic()
    local = getattr(server, "target", "local") == "local" and getattr(server, "pid", None) is not None
    dead = check_stubs(server, [model]).get(model, []) if local else []
    if not dead and trigger:
        dead = [trigger]
    orphans = orphan_shm_regions(server) if local else set()
    try:
        server.unload_model(model)
        server.load_model(model)
    except Exception as exc:
        raise StubCrashedError(
            f"model '{model}' had a dead Python stub and reloading it failed: {exc}. Fix the model "
            "folder (see server.log_text()) or restart the server."
        ) from exc
    new_stubs = _wait_for_stubs(server, model, started + timeout_s) if local else {}
    removed: list[str] = []
    if orphans:
        still_orphaned = orphans & orphan_shm_regions(server)
        removed = sorted(remove_shm(still_orphaned))
    recovery = Recovery(
        model=model,
        dead_instances=dead,
        seconds=time.monotonic() - started,
        new_stubs=new_stubs,
        removed_shm=removed,
        trigger=f"Stub process '{trigger}' is not healthy" if trigger else "",
    )
    if notify is not None:
        notify(recovery.message)
    return recovery


def recover_all(server: RunningServer, notify: Notify | None = to_stderr) -> list[Recovery]:
    """Check every READY model and recover each one with a dead stub (local target)."""
    return [recover(server, model, notify=notify) for model in sorted(check_stubs(server))]
