"""Each learner's own network namespace, and the only ways in and out of it: socat forwarders.

Why: every local user can connect to every port on the machine's 127.0.0.1. Without this, a learner
read who owns each port in ``/proc/net/tcp``, subscribed to another learner's kernel (ZMQ on
loopback) and read their code and output, and sent inference requests to another learner's
embedded Triton. In a network namespace of their own, a learner's kernels, terminals and embedded
Triton listen on a loopback that nobody else has (issue 38).

What still crosses, and how: the learner's server needs the hub's API (OAuth, activity), their
kernels need the class's front door (the shared Triton's HTTP, gRPC and metrics ports), and the
hub's proxy needs their JupyterLab. Each such port gets a forwarder pair made of ``socat``
(Debian's package; no code of ours moves bytes), joined by a Unix socket in a folder only root can
enter (``/run/lab-class/<namespace>/``):

* **outward** (the learner reaches port P of the machine): inside the namespace, socat listens on
  its 127.0.0.1:P and connects to ``out-P.sock``; outside, socat listens on that socket and connects
  to the machine's 127.0.0.1:P;
* **inward** (the proxy reaches the learner's JupyterLab on port P): outside, socat listens on the
  machine's 127.0.0.1:P and connects to ``in-P.sock``; inside, socat listens on that socket and
  connects to the namespace's 127.0.0.1:P.

Why not a veth pair between the namespace and the machine: its outer end needs an address in the
machine's own namespace, outside the namespaces the class creates, and traffic here stays on
loopbacks and in namespaces we make ourselves. A Unix socket crosses namespaces through the file
system and needs no address at all. socat 1.7.4 (Debian 12) has no ``netns`` option, hence the pair
(socat 1.8 could open one end in the namespace by itself).

Every forwarder runs as root in a session of its own (its per-connection children too), is started
by ``nsenter --net`` where it belongs inside, and is stopped by its process group's ID, which
:class:`LearnerNetwork` keeps (the spawner saves it in the hub's database, so a restarted hub can
still stop them; :func:`close_network` also finds those whose IDs were lost, by their socket folder).
The namespace is a named one (``ip netns add``): it outlives the hub and is deleted with the
learner's server.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from lab_backends.errors import LabBackendsError
from lab_backends.server.ports import LOCALHOST
from lab_backends.waiting import poll

NETNS_DIR = Path("/run/netns")
SOCKET_ROOT = Path("/run/lab-class")
READY_S = 20.0
#: TCP_NODELAY on every TCP end: without it Nagle's algorithm held a forwarded gRPC request's last small
#: write until the peer's delayed ACK, and lesson 01's p50 through a sandbox was 37 ms instead of 2 ms.
NODELAY = "nodelay"
#: ``/proc/<pid>/net/tcp``'s state of a listening socket.
_LISTEN = "0A"


class NetworkError(LabBackendsError):
    """A learner's network namespace or one of its forwarders could not be set up; the message says why."""


@dataclass
class LearnerNetwork:
    """A learner's network namespace and the process groups of its forwarders (what closing it needs)."""

    name: str                                       #: the namespace's name (``ip netns``)
    groups: list[int] = field(default_factory=list)  #: forwarders' process groups (each socat leads its own)

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    @property
    def socket_dir(self) -> Path:
        return SOCKET_ROOT / self.name

    def enter(self) -> list[str]:
        """The command prefix that runs a command inside the namespace."""
        return ["nsenter", f"--net={self.path}", "--"]

    def to_state(self) -> dict:
        return {"name": self.name, "groups": list(self.groups)}

    @classmethod
    def from_state(cls, state: dict) -> "LearnerNetwork":
        return cls(state["name"], [int(g) for g in state.get("groups", [])])


def namespace_name(user: str) -> str:
    return f"lab-class-{user}"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def open_network(user: str, inward: list[int], outward: list[int]) -> LearnerNetwork:
    """A fresh namespace for ``user`` (a stale one of theirs removed first) with its forwarders, listening."""
    for tool in ("ip", "nsenter", "socat"):
        if shutil.which(tool) is None:
            raise NetworkError(f"{tool} is missing: each learner's network namespace needs it (`make class` installs "
                               "socat; ip and nsenter come with iproute2 and util-linux)")
    net = LearnerNetwork(namespace_name(user))
    close_network(net)
    made = _ip("netns", "add", net.name)
    if made.returncode != 0:
        raise NetworkError(f"could not create the network namespace {net.name}: {made.stderr.strip()} "
                           "(it needs root: CAP_SYS_ADMIN)")
    try:
        up = _ip("-n", net.name, "link", "set", "lo", "up")
        if up.returncode != 0:
            raise NetworkError(f"could not bring up {net.name}'s loopback: {up.stderr.strip()}")
        SOCKET_ROOT.mkdir(mode=0o700, exist_ok=True)
        os.chmod(SOCKET_ROOT, 0o700)
        net.socket_dir.mkdir(mode=0o700)
        listening: list[tuple[int, int]] = []  # (forwarder pid, TCP port it must listen on)
        for port in outward:
            sock = net.socket_dir / f"out-{port}.sock"
            _socat(net, [], f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:{LOCALHOST}:{port},{NODELAY}")
            listening.append((_socat(net, net.enter(), _tcp_listen(port), f"UNIX-CONNECT:{sock}"), port))
        for port in inward:
            sock = net.socket_dir / f"in-{port}.sock"
            _socat(net, net.enter(), f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:{LOCALHOST}:{port},{NODELAY}")
            listening.append((_socat(net, [], _tcp_listen(port), f"UNIX-CONNECT:{sock}"), port))
        _wait_listening(net, listening, len(inward) + len(outward))
    except BaseException:
        close_network(net)
        raise
    return net


def _tcp_listen(port: int) -> str:
    return f"TCP-LISTEN:{port},bind={LOCALHOST},fork,reuseaddr,{NODELAY}"


def _socat(net: LearnerNetwork, prefix: list[str], listen: str, connect: str) -> int:
    proc = subprocess.Popen([*prefix, "socat", listen, connect], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    net.groups.append(proc.pid)
    return proc.pid


def _listens(pid: int, port: int) -> bool:
    """Whether the namespace of process ``pid`` has a TCP socket listening on ``port`` (its ``/proc/net/tcp``)."""
    try:
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(row.split()[1].endswith(f":{port:04X}") and row.split()[3] == _LISTEN for row in rows)


def _wait_listening(net: LearnerNetwork, listening: list[tuple[int, int]], sockets: int) -> None:
    """Until every Unix socket exists and every TCP forwarder listens (in its own namespace), bounded."""
    def ready() -> bool:
        return (len(list(net.socket_dir.glob("*.sock"))) == sockets
                and all(_listens(pid, port) for pid, port in listening))

    if not poll(ready, bool, READY_S, 0.05):
        dead = [pid for pid in net.groups if not _alive(pid)]
        raise NetworkError(f"{net.name}'s forwarders did not all listen within {READY_S:.0f} s "
                           f"({len(dead)} of {len(net.groups)} socat processes exited: a port in use?)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def close_network(net: LearnerNetwork) -> None:
    """Stop the forwarders (their whole process groups), delete the namespace and its sockets; idempotent.

    Forwarders whose group IDs were lost with a hub's state are still found: every one names this
    namespace's socket folder on its command line, which nothing but this module's socat processes does.
    """
    for group in {*net.groups, *_forwarders_of(net)}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(group, 0)  # our child when this process started it: reap it (SIGKILL: at once)
        except ChildProcessError:
            pass
    net.groups.clear()
    if net.path.exists():
        _ip("netns", "delete", net.name)
    shutil.rmtree(net.socket_dir, ignore_errors=True)


def _forwarders_of(net: LearnerNetwork) -> list[int]:
    """The socat processes (their process groups) whose command line names ``net``'s socket folder."""
    mark = f"{net.socket_dir}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if Path(args[0].decode(errors="replace")).name == "socat" and any(mark in a for a in args[1:]):
                found.append(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    return found
