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

Connections are the learner's own cost (issue 46). socat relays each connection with a process
of its own on each side of the pair (``fork``). Run as root outside the learner's limits, a learner
who opened 4,657 idle connections made 6,670 socat processes (the machine's tasks went from 770 to
7,401): the machine's pid limit was the only bound, and every learner and the hub shared it. So,
when the spawner passes a :class:`Confinement`:

* **in the learner's cgroups**: every forwarder (both sides, listeners and relays) joins the learner's
  memory and cpu groups. The outward ones (what the learner's code opens: the door's and the hub's
  ports) join a pids group of their own *inside* the learner's: its ``pids.max`` (``2 x connections +
  listeners``, :attr:`LearnerLimits.forwarder_tasks`) is the per-learner connection cap, and the
  learner's own ``pids.max`` counts the relays too. A flood costs the machine at most that many tasks,
  whoever floods. Each half of the pair (inside the namespace, outside it) has its own share of that
  cap (``cgroups.forwarder_groups``, :attr:`LearnerLimits.half_tasks`): with one shared cap the
  namespace side's relays could take every task, and then no connection got its outside half. The
  inward pair (the hub's proxy to the learner's JupyterLab) joins the learner's own pids group instead,
  outside the cap: a kernel that holds every connection it may open must not also take away the page
  where the learner interrupts it;
* **refused fast**: at the cap a relay's ``fork`` fails, and socat 1.7.4's listener then exits (``fork():
  Resource temporarily unavailable``, exit 1): the connection it had accepted is closed and those queued
  on its socket are reset; until :data:`RESTART_S` later, when the forwarder's loop starts it again, the
  port refuses at once (nothing listens). socat's own cap, ``max-children=N``, was measured to do worse:
  past N the listener stops accepting, and the next connections wait in its backlog with no answer (a
  client hangs until its own timeout). The listener's other option on a failed fork, ``forever``, leaks
  the accepted socket (that client hangs too, and the listener keeps one descriptor more each time). The
  loop is a shell outside the learner's groups (one per forwarder): when the learner's tasks are all
  taken, it can still start the listener again, and the new listener joins their groups (moving a task
  into a cgroup v1 group never fails on its ``pids.max``). Connections already relayed are untouched;
* **as the learner where root is not needed**: the relays *inside* the namespace run as the learner
  (socat's ``su-d`` on the address they connect: each relay connects as root, the Unix socket's folder is
  root's, then drops to the learner for the transfer). Their listeners stay root: they only accept and
  fork, and the pair's socket folder must stay out of the learner's reach (a folder of theirs would let
  them swap a socket file that root then chmods). The outside side stays root too: it runs in the
  machine's network namespace, where a process of the learner's is what the namespace exists to prevent;
  it sees the learner's bytes only after they crossed their own relay.

Without a :class:`Confinement` (the sandboxed lesson replays and the module's own tests) the forwarders
run as root, outside any learner's groups. Either way each one runs in a session of its own under its
restart loop (its relays too), is started by ``nsenter --net`` where it belongs inside, and is stopped by
its process group's ID, which :class:`LearnerNetwork` keeps (the spawner saves it in the hub's database,
so a restarted hub can still stop them; :func:`close_network` also finds those whose IDs were lost, by
their socket folder). The namespace is a named one (``ip netns add``): it outlives the hub and is deleted
with the learner's server.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from lab_backends.classroom import cgroups
from lab_backends.errors import LabBackendsError
from lab_backends.server.ports import LOCALHOST
from lab_backends.waiting import poll

NETNS_DIR = Path("/run/netns")
SOCKET_ROOT = Path("/run/lab-class")
READY_S = 20.0
#: How long :func:`close_network` waits for its forwarders' processes to be reaped (this VM's init took 1-2 s).
GONE_S = 5.0
#: TCP_NODELAY on every TCP end: without it Nagle's algorithm held a forwarded gRPC request's last small
#: write until the peer's delayed ACK, and lesson 01's p50 through a sandbox was 37 ms instead of 2 ms.
NODELAY = "nodelay"
#: ``/proc/<pid>/net/tcp``'s state of a listening socket.
_LISTEN = "0A"
#: The TCP listeners' accept queue (socat's default is 5). At the connection cap a listener exits (module doc), and
#: the connections that queued meanwhile are reset with it; in a queue of 5 a fast client's next connection found
#: it full and its SYN was dropped: that client waited a second for its SYN again (measured: 18 of 300 connections
#: 1.02 s each). The kernel caps it at the namespace's ``net.core.somaxconn`` (4096 on Linux 5.4 and later).
BACKLOG = 1024
#: Seconds between a forwarder's listener exiting (a refused fork at the connection cap) and its next start.
RESTART_S = 0.2
#: Each forwarder's loop: its listener (``$@``) started again whenever it exits, :data:`RESTART_S` apart.
_RESTART = f'while :; do "$@"; sleep {RESTART_S}; done'
#: The loop's ``$0``: how ``ps`` names a forwarder.
_LOOP_NAME = "lab-forwarder"


class NetworkError(LabBackendsError):
    """A learner's network namespace or one of its forwarders could not be set up; the message says why."""


@dataclass
class LearnerNetwork:
    """A learner's network namespace and the process groups of its forwarders (what closing it needs)."""

    name: str                                       #: the namespace's name (``ip netns``)
    groups: list[int] = field(default_factory=list)  #: forwarders' process groups (each restart loop leads one)

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


@dataclass(frozen=True)
class Confinement:
    """Whose limits a learner's forwarders run within (module doc): their cgroups, and their user for the relays
    inside the namespace."""

    user: str                         #: the relays inside the namespace run as this user (socat's ``su-d``)
    outward_inside: tuple[Path, ...]  #: the cgroups the outward forwarders inside the namespace join (capped)
    outward_outside: tuple[Path, ...]  #: the cgroups their other halves, outside, join (capped apart)
    inward: tuple[Path, ...]          #: the inward forwarders' (``cgroups.learner_groups``: the learner's own)

    @classmethod
    def of(cls, user: str, groups: list[Path]) -> "Confinement":
        """``user``'s confinement, their own ``groups`` (``cgroups.create``) for the inward pair."""
        return cls(user, tuple(cgroups.forwarder_groups(user, "inside")),
                   tuple(cgroups.forwarder_groups(user, "outside")), tuple(groups))


@dataclass(frozen=True)
class Forwarder:
    """One forwarder's command line, and what it listens on once it runs."""

    command: list[str]
    port: int | None  #: the TCP port it listens on (in its own namespace); ``None``: a Unix socket
    inside: bool      #: started inside the learner's namespace


def namespace_name(user: str) -> str:
    return f"lab-class-{user}"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def open_network(user: str, inward: list[int], outward: list[int],
                 confinement: Confinement | None = None) -> LearnerNetwork:
    """A fresh namespace for ``user`` (a stale one of theirs removed first) with its forwarders, listening.

    With a ``confinement``, the forwarders run within that learner's cgroups and relay as them (module doc)."""
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
        forwarders = forwarder_commands(net, inward, outward, confinement)
        listening = [(_start(net, f.command), f.port) for f in forwarders]
        _wait_listening(net, [(pid, port) for pid, port in listening if port is not None],
                        sum(f.port is None for f in forwarders))
    except BaseException:
        close_network(net)
        raise
    return net


def forwarder_commands(net: LearnerNetwork, inward: list[int], outward: list[int],
                       confinement: Confinement | None = None) -> list[Forwarder]:
    """The command lines of ``net``'s forwarders: for each port, its pair (module doc). Pure: nothing runs."""
    drop = f",su-d={confinement.user}" if confinement else ""
    out_here = cgroups.join_command(list(confinement.outward_outside)) if confinement else []
    out_there = cgroups.join_command(list(confinement.outward_inside)) if confinement else []
    into = cgroups.join_command(list(confinement.inward)) if confinement else []
    pairs: list[Forwarder] = []
    for port in outward:
        sock = net.socket_dir / f"out-{port}.sock"
        pairs += [_forwarder(net, False, out_here, _unix_listen(sock), f"TCP:{LOCALHOST}:{port},{NODELAY}", None),
                  _forwarder(net, True, out_there, _tcp_listen(port), f"UNIX-CONNECT:{sock}{drop}", port)]
    for port in inward:
        sock = net.socket_dir / f"in-{port}.sock"
        pairs += [_forwarder(net, True, into, _unix_listen(sock), f"TCP:{LOCALHOST}:{port},{NODELAY}{drop}", None),
                  _forwarder(net, False, into, _tcp_listen(port), f"UNIX-CONNECT:{sock}", port)]
    return pairs


def _forwarder(net: LearnerNetwork, inside: bool, join: list[str], listen: str, connect: str,
               port: int | None) -> Forwarder:
    command = [*(net.enter() if inside else []), "sh", "-c", _RESTART, _LOOP_NAME, *join, "socat", listen, connect]
    return Forwarder(command, port, inside)


def _tcp_listen(port: int) -> str:
    return f"TCP-LISTEN:{port},bind={LOCALHOST},fork,reuseaddr,backlog={BACKLOG},{NODELAY}"


def _unix_listen(sock: Path) -> str:
    """``unlink-early``: a listener started again by its loop replaces the socket file its predecessor left."""
    return f"UNIX-LISTEN:{sock},fork,mode=600,unlink-early"


def _start(net: LearnerNetwork, command: list[str]) -> int:
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
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
        deaf = [port for pid, port in listening if not _listens(pid, port)]
        raise NetworkError(f"{net.name}'s forwarders did not all listen within {READY_S:.0f} s (not on ports "
                           f"{deaf}: in use?)")


def close_network(net: LearnerNetwork) -> None:
    """Stop the forwarders (their whole process groups), delete the namespace and its sockets; idempotent.

    Forwarders whose group IDs were lost with a hub's state are still found: every one names this
    namespace's socket folder on its command line, which nothing but this module's socat processes does.
    Returns once no process of those groups is left (bounded): a listener's relays are its children, not
    ours, and the kernel hands them to the machine's init to reap once their parent is gone.
    """
    groups = {*net.groups, *_forwarders_of(net)}
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(group, 0)  # our child when this process started it: reap it (SIGKILL: at once)
        except ChildProcessError:
            pass
    poll(lambda: _in_groups(groups), lambda left: not left, GONE_S, 0.02)
    net.groups.clear()
    if net.path.exists():
        _ip("netns", "delete", net.name)
    shutil.rmtree(net.socket_dir, ignore_errors=True)


def _in_groups(groups: set[int]) -> list[int]:
    """The processes (zombies too: not yet reaped) whose process group is one of ``groups``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) in groups:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _forwarders_of(net: LearnerNetwork) -> list[int]:
    """The forwarders' processes (socat, their loops' shells: their process groups) whose command line names
    ``net``'s socket folder."""
    mark = f"{net.socket_dir}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if Path(args[0].decode(errors="replace")).name in ("socat", "sh") and any(mark in a for a in args[1:]):
                found.append(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    return found
