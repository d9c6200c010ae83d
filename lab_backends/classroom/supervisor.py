"""Start a class on one machine, keep it up, and stop everything it started, by PID (``class start|stop``).

Why a supervisor of our own: ``make class`` must leave nothing behind after Ctrl-C or
``make class-stop``, on a machine where other people run things too. So nothing is stopped by name:
the supervisor starts two children, each in its own session, and remembers their PIDs:

1. ``lab-backends serve --restart --front-door --standby`` (the shared Triton: two tritonservers behind
   the door, so a crash costs the class under a second (``server/standby.py``); its own watchdog stops
   each tritonserver and its stubs and removes their ``/dev/shm`` regions), with a fresh admin key
   written to a root-only file and the APIs of deploy/triton restricted. Learners reach it through
   the door (nginx, ``server/front_door.py``), which holds the class's ports while a crashed
   tritonserver is restarted behind it, so no learner can bind them meanwhile, and gives each
   learner a share of it (``--learner-secret-file``: the hub hands each learner's server its token);
2. ``jupyterhub`` (which starts configurable-http-proxy and, per learner, the namespaced servers).

Stopping runs in the reverse order: the hub first (it stops every learner's server and the proxy
itself), then Triton; whatever one of them left (a descendant seen while it ran, or a process of a
learner's account) is killed by PID, and ``/dev/shm`` files owned by learners' accounts are
removed. Both children also get SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from lab_backends import learner, rest
from lab_backends.classroom import cgroups
from lab_backends.classroom.network import LearnerNetwork, close_network, namespace_name
from lab_backends.classroom.roster import RosterError, kill_processes_of, require_root
from lab_backends.classroom.settings import (
    CLASS_RESTRICTED,
    DUMB_INIT,
    PROXY_BIN,
    ClassSettings,
    hub_config,
    private_dir,
)
from lab_backends.errors import FrontDoorError, LabBackendsError
from lab_backends.server import limits
from lab_backends.server.admin import write_key_file
from lab_backends.server.crash import backoff_delay, describe_exit
from lab_backends.server.front_door import nginx_binary
from lab_backends.server.ports import port_is_free
from lab_backends.server.processes import SHM_DIR

PIDS_FILE = "pids.json"


class ClassError(LabBackendsError):
    """The class cannot start or stop; the message says why and what to do."""


#: What each child of the supervisor is called in its messages.
ROLES = {"triton": "the shared Triton (lab-backends serve)", "hub": "JupyterHub"}


@dataclass
class Running:
    """The class's processes: the supervisor and its two children (their PIDs are what stop uses)."""

    supervisor: int
    triton: subprocess.Popen
    hub: subprocess.Popen
    seen: set[int]  #: every descendant seen while they ran: killed by PID if a child left it behind
    #: A new child for a role of :data:`ROLES`, started with the same command (``supervise`` restarts the dead).
    respawn: Callable[[str], subprocess.Popen] | None = None


def preflight(settings: ClassSettings) -> None:
    """One clear error per thing that would make the start fail half-way."""
    require_root("class start")
    ports = {"--hub-port": settings.hub_port, "hub API": settings.hub_api_port,
             "proxy API": settings.proxy_api_port, **dict(zip(("Triton HTTP", "Triton gRPC", "Triton metrics"),
                                                               settings.triton_ports))}
    for what, port in ports.items():
        if not port_is_free(port):
            raise ClassError(f"port {port} ({what}) is taken on 127.0.0.1: stop what uses it "
                             f"(`ss -ltnp 'sport = :{port}'` says what) or choose other ports (`class start --help`)")
    if not PROXY_BIN.exists():
        raise ClassError(f"configurable-http-proxy is not installed at {PROXY_BIN}: run `make class` (it installs it "
                         "with npm under build/class-proxy)")
    if shutil.which("jupyterhub", path=str(Path(sys.executable).parent)) is None:
        raise ClassError("jupyterhub is not installed in this environment: run `make class` "
                         "(pip install -e '.[class]')")
    if not DUMB_INIT.exists():
        raise ClassError(f"dumb-init is not installed at {DUMB_INIT}: run `make class` (pip install -e '.[class]')")
    try:
        nginx_binary()  # the shared Triton's front door
    except FrontDoorError as exc:
        raise ClassError(str(exc).replace("make door-deps", "make class")) from None
    for tool, package in (("unshare", "util-linux"), ("setpriv", "util-linux"), ("nsenter", "util-linux"),
                          ("ip", "iproute2"), ("socat", "socat")):
        if shutil.which(tool) is None:
            raise ClassError(f"{tool} is missing: install {package} (`make class` installs socat); each learner's "
                             "server runs under it")
    for controller in cgroups.CONTROLLERS:
        cgroups.own_group(controller)  # LimitsError says what is missing
    try:
        grp.getgrnam(settings.group)
    except KeyError:
        raise RosterError(f"the class group {settings.group} does not exist: create the learners first "
                          "(`lab-backends class add-learners roster.txt`)") from None


def _wait(what: str, ready: Callable[[], bool], children: list[subprocess.Popen], logs: list[Path],
          timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        for child, log in zip(children, logs):
            if child.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise ClassError(f"{what}: {Path(child.args[0]).name} exited ({child.returncode}); {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise ClassError(f"{what}: not ready within {timeout_s:.0f} s (logs: {', '.join(map(str, logs))})")
        time.sleep(0.25)


def _answers(url: str) -> bool:
    try:
        return rest.request(url, timeout=2)[0] == 200
    except OSError:
        return False


def _spawn(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        # dies with this process (PR_SET_PDEATHSIG through setpriv; no preexec_fn: server/limits.py)
        return subprocess.Popen([*limits.launch_prefix(die_with_parent=True), *cmd], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True)


def start(settings: ClassSettings, say: Callable[[str], None] = print, timeout_s: float = 300.0) -> Running:
    """The shared Triton, then the hub; returns when both answer (or stops what it started and raises)."""
    preflight(settings)
    state = private_dir(settings.state_dir)
    settings.settings_file.write_text(settings.to_json())
    settings.config_file.write_text(hub_config(settings))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_ADMIN_KEY", "TRITON_URL", "JUPYTERHUB_API_TOKEN")}
    bin_dir = Path(sys.executable).parent
    http, grpc_port, metrics = settings.triton_ports
    settings.key_file.unlink(missing_ok=True)
    write_key_file(settings.learners_secret_file, learner.new_secret())  # a class's learners' tokens: new each start
    serve = [str(bin_dir / "lab-backends"), "serve", "--restart", "--front-door", "--standby",
             "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics),
             "--admin-key-file", str(settings.key_file), "--learner-secret-file", str(settings.learners_secret_file),
             "--restricted-apis", ",".join(CLASS_RESTRICTED), *[a for m in settings.models for a in ("--model", m)]]
    hub_cmd = [str(bin_dir / "jupyterhub"), "-f", str(settings.config_file)]

    def respawn(role: str) -> subprocess.Popen:
        return _spawn(serve, state / "triton.log", env, state) if role == "triton" else _spawn(
            hub_cmd, state / "hub.log", env, state)

    triton = respawn("triton")
    hub = None
    try:
        _wait("the shared Triton", lambda: settings.key_file.exists() and _answers(
            f"http://{settings.triton_http}/v2/health/ready"), [triton], [state / "triton.log"], timeout_s)
        say(f"shared Triton ready: http://{settings.triton_http} (pid {triton.pid}; "
            f"key in {settings.key_file}, root only)")
        hub = respawn("hub")
        _wait("JupyterHub", lambda: _answers(f"{settings.hub_url}/hub/api/"), [hub, triton],
              [state / "hub.log", state / "triton.log"], 120)
    except BaseException:
        stop(Running(os.getpid(), triton, hub or triton, set()), settings, say)
        raise
    running = Running(os.getpid(), triton, hub, set(), respawn)
    _remember(running)
    _write_pids(running, settings)
    say(f"JupyterHub ready: {settings.hub_url}/ (pid {hub.pid}); learners log in with their Unix name and password")
    return running


def _remember(running: Running) -> None:
    """Add the children's descendants to ``seen``; forget the dead (their PIDs may be reused after restarts)."""
    running.seen.difference_update([pid for pid in running.seen if not psutil.pid_exists(pid)])
    for child in (running.triton, running.hub):
        try:
            running.seen.update(p.pid for p in psutil.Process(child.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass


def _write_pids(running: Running, settings: ClassSettings) -> None:
    """What ``class stop`` (another process) reads: the supervisor and its children's current PIDs."""
    path = settings.state_dir / PIDS_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"supervisor": running.supervisor, "triton": running.triton.pid,
                                   "hub": running.hub.pid}))
    os.replace(partial, path)  # whole or not at all: a reader never sees it half-written (a fresh clone's test did)


def supervise(running: Running, settings: ClassSettings, say: Callable[[str], None] = print,
              backoff_s: float = 1.0) -> int:
    """Until Ctrl-C / SIGTERM (0); then everything stops. A child that dies is started again.

    Why restart instead of ending the class: one learner could otherwise end it for everyone (kill
    the shared Triton's supervisor or crash the hub). ``serve --restart`` already brings a crashed
    tritonserver back on its ports; here a dead ``serve`` or hub is started again with the same
    command, after the same capped, doubling backoff (``crash.backoff_delay``). A restarted hub finds
    the learners' servers still running: they are not its children's children by then but its
    database's (``LocalProcessSpawner`` keeps each server's PID in its state and polls it), and
    JupyterHub stops the old proxy from its PID file and routes to them again.
    """
    def _stop_requested(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop_requested)
    signal.signal(signal.SIGINT, _stop_requested)  # also when started in the background, where SIGINT comes ignored
    deaths: list[float] = []
    try:
        say("the class runs; Ctrl-C here or `make class-stop` stops everything it started")
        while True:
            _remember(running)
            for role, what in ROLES.items():
                child = getattr(running, role)
                if child.poll() is None or running.respawn is None:
                    continue
                now = time.monotonic()
                deaths = [t for t in deaths if now - t < 60] + [now]
                delay = backoff_delay(len(deaths), backoff_s)
                say(f"{what} {describe_exit(child.returncode)}; starting it again in {delay:.1f} s "
                    f"({len(deaths)} restart(s) in the last minute); the rest of the class keeps running "
                    f"(logs in {settings.state_dir})")
                time.sleep(delay)
                setattr(running, role, running.respawn(role))
                _write_pids(running, settings)
                say(f"{what} started again: pid {getattr(running, role).pid}")
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM or Ctrl-C must not cut the stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop(running, settings, say)
    return 0


def _stop_child(child: subprocess.Popen, grace_s: float) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=10)


def learner_names(group: str) -> list[str]:
    try:
        return list(grp.getgrnam(group).gr_mem)
    except KeyError:
        return []


def learner_uids(group: str) -> list[int]:
    uids = []
    for name in learner_names(group):
        try:
            uids.append(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def stop(running: Running, settings: ClassSettings, say: Callable[[str], None] = print) -> None:
    """Hub (learners' servers, proxy) first, then Triton; leftovers killed by PID; learners' shm removed."""
    _remember(running)
    t0 = time.monotonic()
    _stop_child(running.hub, 60.0)
    say(f"JupyterHub stopped ({time.monotonic() - t0:.1f} s): learners' servers and the proxy with it")
    for uid in learner_uids(settings.group):
        if kill_processes_of(uid):
            say(f"killed what the hub left of uid {uid}'s processes")
    for name in learner_names(settings.group):  # what the hub's spawners left of the learners' sandboxes
        close_network(LearnerNetwork(namespace_name(name)))
        try:
            cgroups.remove(name)
        except cgroups.LimitsError as exc:
            say(str(exc))
    _stop_child(running.triton, 40.0)
    say(f"the shared Triton stopped ({time.monotonic() - t0:.1f} s)")
    left = [p for p in map(_process, sorted(running.seen)) if p is not None]
    for proc in left:
        proc.kill()
    psutil.wait_procs(left, timeout=10)
    uids = set(learner_uids(settings.group))
    for path in SHM_DIR.iterdir() if SHM_DIR.is_dir() else []:
        try:
            if path.stat().st_uid in uids:
                path.unlink()
        except FileNotFoundError:
            continue
    (settings.state_dir / PIDS_FILE).unlink(missing_ok=True)
    say("class stopped" + (f" ({len(left)} leftover process(es) killed)" if left else ""))


def _process(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.NoSuchProcess:
        return None


def stop_running(state_dir: Path, say: Callable[[str], None] = print, timeout_s: float = 150.0) -> int:
    """``class stop``: SIGTERM to the supervisor that ``class start`` left in ``pids.json``, and wait for it."""
    require_root("class stop")
    pids_file = state_dir / PIDS_FILE
    if not pids_file.exists():
        say(f"no class is running (no {pids_file})")
        return 0
    pids = json.loads(pids_file.read_text())
    supervisor = _process(int(pids["supervisor"]))
    if supervisor is None or "class" not in " ".join(supervisor.cmdline()):
        say(f"the supervisor (pid {pids['supervisor']}) is gone; stopping what it recorded")
        for pid in (pids.get("hub"), pids.get("triton")):
            proc = _process(int(pid)) if pid else None
            if proc is not None:
                proc.terminate()
                psutil.wait_procs([proc], timeout=60)
        pids_file.unlink(missing_ok=True)
        return 1
    supervisor.terminate()
    deadline = time.monotonic() + timeout_s
    # Not psutil.wait_procs: the supervisor is not our child, and once it exits it stays a zombie until
    # *its* parent reaps it (make, a test runner); a zombie has stopped everything, it counts as gone.
    while _process(supervisor.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    if _process(supervisor.pid) is not None:
        raise ClassError(f"the class supervisor (pid {supervisor.pid}) did not stop within {timeout_s:.0f} s")
    say(f"class stopped (supervisor pid {supervisor.pid})")
    return 0
