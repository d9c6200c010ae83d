"""The front door: Debian's nginx before a shared tritonserver, started and stopped by PID.

Why nginx and not a proxy of our own: it is maintained, packaged by Debian (``make door-deps``),
speaks HTTP/2 to gRPC clients and servers (``grpc_pass``), limits bodies before reading them, and
logs every request. What it refuses is in :mod:`lab_backends.server.door_config`.

The door holds the ports clients were told (``serve --http-port/--grpc-port/--metrics-port``),
bound by ``serve`` before anything starts (:mod:`lab_backends.server.netns`, which also puts
tritonserver, as root, where only the door reaches it); tritonserver gets ports of its own behind
it. So while ``serve --restart`` brings a crashed tritonserver back the public ports stay held and
nobody else can bind them (a learner bound a freed port 0.09 s after a crash and answered for the
server): clients get a 503 that says the server is restarting.

The key never goes on nginx's command line or into its environment: it is in the config file, in a
folder only this user can read (0700; nginx reads the file before it drops to ``worker_user``).

Behind nginx, before tritonserver, the validating gateway (:mod:`lab_backends.server.door_gateway`)
checks every inference request against the served models' configs (Triton 2.51 crashes on some that
no client sends: :mod:`lab_backends.server.door_rules`). It starts first (its ports go into nginx's
config), within :data:`GATEWAY_DEADLINE_S`, and stops after nginx, by PID, with a watchdog of its own.

``serve --standby`` (the class's default) puts a second tritonserver behind the door
(:mod:`lab_backends.server.standby`). The gateway, not nginx, chooses between the two
(:mod:`lab_backends.server.gateway_failover`), and nginx hands it every request then
(:mod:`lab_backends.server.door_upstreams`): nginx's ``server B backup`` would go back to A as soon as A
is up again, so statistics, metadata and a sequence's next step would reach a server other than the one
that answered, and nginx cannot tell a sequence's step from a fresh request. The gateway keeps the
server that answers (the one restarted after a crash becomes the standby), sends a request again to the
other when the active one refuses or drops it, and refuses the next step of a sequence whose server died.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab_backends.errors import FrontDoorError
from lab_backends.server.admin import write_private
from lab_backends.server.door_config import DoorSettings, FairShare, GatewaySettings, render
from lab_backends.server.door_limits import body_limit
from lab_backends.server.gateway_watch import GatewayWatch
from lab_backends.server.netns import PublicPorts
from lab_backends.server.options import RESTRICTED_APIS
from lab_backends.server.processes import terminate
from lab_backends.server.repository import config_problem, model_dirs, read_config
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll

NGINX = "/usr/sbin/nginx"
START_DEADLINE_S = 10.0
#: The gateway imports grpc, aiohttp, numpy and tritonclient first: ~1 s here, more on a loaded machine.
GATEWAY_DEADLINE_S = 60.0
#: ``serve --standby`` writes each tritonserver's ports and PID here (in the door's folder) after each start.
SERVERS_FILE = "servers.json"
#: A gRPC stream may carry this many of the largest messages in all (nginx cannot bound a stream; a 256 MiB
#: message took tritonserver to 3.39 GB for good): past it, RESOURCE_EXHAUSTED, and a new stream goes on.
STREAM_MESSAGES = 64


def nginx_binary() -> str:
    """Debian's nginx, or a clear error that says how to install it."""
    found = shutil.which("nginx") or (NGINX if os.access(NGINX, os.X_OK) else None)
    if found is None:
        raise FrontDoorError("the front door needs Debian's nginx: run `make door-deps` (as root or with "
                             "password-less sudo), or `apt-get install nginx`")
    return found


def read_fair_share(path: Path, limits: dict[str, int]) -> FairShare:
    """``serve --learner-secret-file F``'s share: the class's secret from ``F``, which only its owner may read."""
    try:
        info = path.stat()
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise FrontDoorError(f"cannot read the learners' secret {path}: {exc.strerror or exc}; `lab-backends class "
                             "start` writes it (or write one: python -c 'import secrets; "
                             "print(secrets.token_urlsafe(32))' > F; chmod 600 F)") from None
    if info.st_mode & 0o077:
        raise FrontDoorError(f"{path} is readable by others (mode {info.st_mode & 0o777:04o}): anyone could make a "
                             f"learner's token; `chmod 600 {path}`")
    return FairShare(secret, **limits)


def door_for(server: TritonServer, ports: PublicPorts, access: DoorAccess, workdir: Path,
             share: FairShare | None = None, validate: bool = True, standby: TritonServer | None = None,
             restart: bool = False) -> "FrontDoor":
    """The door before a running local ``server``, on the sockets ``ports`` holds.

    Its body limit is sized to every model of the server's repositories (any of them can be loaded
    later); ``access`` says which APIs need which key at the door (tritonserver itself may hold none:
    :mod:`lab_backends.server.netns`); ``share``, each learner's identity and limits (a class). A root
    ``serve`` hands nginx's workers to ``nobody``. ``standby``: ``serve --standby``'s second server (the
    gateway chooses between the two: module doc). ``restart``: the gateway is started again whenever it
    exits (:mod:`lab_backends.server.gateway_watch`), as ``serve --restart`` does tritonserver.
    """
    if standby is not None and not validate:
        raise FrontDoorError("a standby tritonserver needs the door's gateway (it chooses between the servers)")
    configs = [read_config(d) for d in model_dirs(server.options.model_repositories).values()
               if config_problem(d) is None]
    limit = body_limit(configs)
    return FrontDoor(DoorSettings(
        http_port=ports.port("http"), grpc_port=ports.port("grpc"), metrics_port=ports.port("metrics"),
        triton_http_port=server.http_port, triton_grpc_port=server.grpc_port,
        triton_metrics_port=server.metrics_port, workdir=workdir, body_limit=limit,
        restricted_apis=access.restricted_apis, admin_key=access.admin_key,
        worker_user="nobody" if os.geteuid() == 0 else None, fair_share=share,
        standby_metrics_port=standby.metrics_port if standby else None,
    ), ports, gateway_settings(server, workdir, limit, standby) if validate else None, keep_gateway=restart)


def gateway_settings(server: TritonServer, workdir: Path, limit: int,
                     standby: TritonServer | None = None) -> GatewaySettings:
    """The validating gateway's settings before ``server`` (and ``standby``): its repositories, and the door's
    body limit for one HTTP body or gRPC message (:data:`STREAM_MESSAGES` of them for a stream)."""
    return GatewaySettings(
        triton_http_port=server.http_port, triton_grpc_port=server.grpc_port,
        repositories=tuple(str(r) for r in server.options.model_repositories), message_limit=limit,
        stream_limit=STREAM_MESSAGES * limit, ready_file=str(workdir / "gateway.ready"),
        **({"standby_http_port": standby.http_port, "standby_grpc_port": standby.grpc_port,
            "servers_file": str(workdir / SERVERS_FILE)} if standby else {}))


def servers_file(door: "FrontDoor | None") -> Path | None:
    """Where ``serve --standby`` writes its servers' ports and PIDs for the gateway (:data:`SERVERS_FILE`)."""
    return door.settings.workdir / SERVERS_FILE if door is not None else None


def banner(door: "FrontDoor", server: TritonServer, standby: TritonServer | None = None) -> list[str]:
    """``serve``'s lines for the door: where clients go, and where tritonserver is (not for them)."""
    s = door.settings
    where = ("in a network namespace of its own: only the door reaches them" if door.ports.isolated else
             "on this machine's loopback, where local users can reach them: run serve as root to isolate them")
    return [
        f"  HTTP/REST : http://{s.host}:{s.http_port}",
        f"  gRPC      : {s.host}:{s.grpc_port}",
        f"  metrics   : http://{s.host}:{s.metrics_port}/metrics",
        f"  front door: nginx (pid {door.pid}), its log {s.access_log}; tritonserver's own ports {server.http_port} "
        f"and {server.grpc_port} are not for clients ({where})",
        *([f"  validation: door_gateway (pid {door.gateway.pid}) checks each inference request against the "
           f"models' configs, its log {door.gateway.log}"] if door.gateway and door.gateway.pid else []),
        *([f"  standby   : tritonserver (pid {standby.pid}), its own ports {standby.http_port} and "
           f"{standby.grpc_port}: it takes over when the active one crashes (the gateway chooses; serve restarts "
           "the crashed one)"]
          if standby is not None else []),
    ]


@dataclass(frozen=True)
class DoorAccess:
    """What the door asks for: the admin key (``None``: open) and the APIs behind it."""

    admin_key: str | None = field(default=None, repr=False)
    restricted_apis: tuple[str, ...] = RESTRICTED_APIS

    @classmethod
    def from_serve_options(cls, options: dict) -> "DoorAccess":
        """From :func:`admin.serve_options`'s keyword arguments (``restricted_apis=()``: open)."""
        apis = tuple(options.get("restricted_apis", RESTRICTED_APIS))
        return cls(options.get("admin_key") if apis else None, apis)


class FrontDoor:
    """nginx with :func:`door_config.render`'s config, in the foreground, in a session of its own.

    ``with FrontDoor(settings) as door:`` starts it (config checked first, then both ports
    listening, within :data:`START_DEADLINE_S`) and stops it by PID on the way out.
    """

    def __init__(self, settings: DoorSettings, ports: PublicPorts, gateway: GatewaySettings | None = None,
                 keep_gateway: bool = False) -> None:
        self.settings = settings
        self.keep_gateway = keep_gateway
        self.watch: GatewayWatch | None = None
        self.ports = ports  # bound already: nginx inherits them (netns.py)
        self.proc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self.gateway = Gateway(gateway, settings.workdir, settings.admin_key) if gateway else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def config_path(self) -> Path:
        return self.settings.workdir / "nginx.conf"

    def __enter__(self) -> "FrontDoor":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.gateway is not None:
            self._prepare_workdir()
            try:
                http_port, grpc_port = self.gateway.start()
            except FrontDoorError:
                self.stop()
                raise
            self.settings = replace(self.settings, gateway_http_port=http_port, gateway_grpc_port=grpc_port)
        s = self.settings
        self._write_config()
        nginx = nginx_binary()
        command = [nginx, "-p", str(s.workdir), "-c", str(self.config_path), "-e", str(s.error_log)]
        check = subprocess.run([*command, "-t", "-q"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            self.stop()  # the gateway, started already
            raise FrontDoorError(f"nginx refused the front door's config ({self.config_path}): "
                                 f"{(check.stderr or check.stdout).strip()[-500:]}")
        fds = [sock.fileno() for sock in self.ports.sockets]
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=fds,
                                     env={**_plain_env(), "NGINX": "".join(f"{fd};" for fd in fds)})
        # The tritonserver's own guardian: if we die unstopped (SIGKILL), nginx must not hold the ports.
        self._watchdog = subprocess.Popen([sys.executable, "-m", "lab_backends.server.watchdog", str(os.getpid()),
                                           str(self.proc.pid), "5"], start_new_session=True)
        # The sockets listen already (connections wait in their backlog): nginx is up once it has
        # written its PID file, which it does after taking them over.
        started = poll(lambda: self.proc.poll() is not None or self._pid_file.exists(), bool, START_DEADLINE_S, 0.05)
        if self.proc.poll() is not None or not started:
            self.stop()
            raise FrontDoorError(f"nginx did not start within {START_DEADLINE_S:g} s: "
                                 f"{self.error_tail() or 'no error logged'}")
        if self.gateway is not None and self.keep_gateway:
            self.watch = GatewayWatch(self.gateway.exit_code, self.gateway.restart,
                                      lambda line: print(line, file=sys.stderr, flush=True)).start()

    def stop(self) -> None:
        """SIGTERM (nginx's fast shutdown), then SIGKILL; nginx's workers leave with their master."""
        if self.watch is not None:
            self.watch.stop()  # first: the gateway is stopped on purpose
        if self.proc is not None:
            terminate(self.proc, grace_s=5.0)
        if self._watchdog is not None:
            terminate(self._watchdog, grace_s=5.0)
        if self.gateway is not None:
            self.gateway.stop()

    def error_tail(self, lines: int = 3) -> str:
        path = self.settings.error_log
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    @property
    def _pid_file(self) -> Path:
        return self.settings.workdir / "nginx.pid"

    def _write_config(self) -> None:
        """The config holds the key: created 0600 in a folder others cannot list (0700; 0711 when root's
        nginx hands its workers to ``worker_user``, who must reach their temp folders in it)."""
        self._prepare_workdir()
        write_private(self.config_path, render(self.settings))

    def _prepare_workdir(self) -> None:
        s = self.settings
        mode = 0o711 if s.worker_user else 0o700
        s.workdir.mkdir(mode=mode, parents=True, exist_ok=True)
        os.chmod(s.workdir, mode)
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (s.workdir / temp).mkdir(mode=0o700, exist_ok=True)
            if s.worker_user:  # the workers write large request bodies here
                shutil.chown(s.workdir / temp, user=s.worker_user, group=s.worker_group)


class Gateway:
    """The validating gateway process (:mod:`lab_backends.server.door_gateway`), started and stopped by PID.

    Its environment is serve's minus anything holding the admin key (it needs none: nginx checks it).
    """

    def __init__(self, settings: GatewaySettings, workdir: Path, admin_key: str | None) -> None:
        self.settings, self.workdir, self._key = settings, workdir, admin_key
        self.proc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log(self) -> Path:
        return self.workdir / "gateway.log"

    def start(self) -> tuple[int, int]:
        """Start it; its HTTP and gRPC ports once both listen, within :data:`GATEWAY_DEADLINE_S`."""
        ready, path = Path(self.settings.ready_file), self.workdir / "gateway.json"
        ready.unlink(missing_ok=True)
        self.settings.write(path)
        env = {k: v for k, v in os.environ.items() if not (self._key and self._key in v)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab_backends.server.door_gateway", str(path)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                         env=env)
        self._watchdog = subprocess.Popen([sys.executable, "-m", "lab_backends.server.watchdog", str(os.getpid()),
                                           str(self.proc.pid), "5"], start_new_session=True)
        poll(lambda: self.proc.poll() is not None or ready.exists(), bool, GATEWAY_DEADLINE_S, 0.05)
        if self.proc.poll() is not None or not ready.exists():
            logged = self.log.read_text(errors="replace") if self.log.exists() else ""
            tail = " | ".join(logged.strip().splitlines()[-3:])
            self.stop()
            raise FrontDoorError(f"the front door's gateway did not start within {GATEWAY_DEADLINE_S:g} s: "
                                 f"{tail or 'nothing logged'} (its log: {self.log})")
        where = json.loads(ready.read_text())
        # A restart listens where this start did: nginx's upstreams name these ports.
        self.settings = replace(self.settings, http_port=int(where["http_port"]), grpc_port=int(where["grpc_port"]))
        return self.settings.http_port, self.settings.grpc_port

    def exit_code(self) -> int | None:
        """None while it runs (or before it started), else how it exited."""
        return self.proc.poll() if self.proc is not None else None

    def restart(self) -> str:
        """Start it again on the same ports (:mod:`gateway_watch`); where it now runs."""
        self.stop()
        http_port, grpc_port = self.start()
        return f"pid {self.pid}, ports {http_port} (HTTP) and {grpc_port} (gRPC)"

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, grace_s=5.0)
        if self._watchdog is not None:
            terminate(self._watchdog, grace_s=5.0)


def _plain_env() -> dict[str, str]:
    """nginx's environment: nothing of ours (no key can be in it even if a caller's had one)."""
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LANG": "C"}

