"""Each learner's share of the machine: a cgroup per learner for memory, processes and CPU (cgroup v1).

Why: without limits one learner's 6 GiB array or fork bomb takes the machine from everyone (issue
38: a 6 GiB hog and 1,500 processes ran unchecked). The kernel's cgroups bound a group of processes
whatever they do, and every process a learner starts descends from their server, which starts inside
their group: a learner cannot leave it (``cgroup.procs`` is root's).

The three controllers, as this machine mounts them (cgroup v1, one hierarchy each under
``/sys/fs/cgroup/<controller>``; the kernel's ``Documentation/admin-guide/cgroup-v1/``):

* **memory** ``memory.limit_in_bytes``: past it the kernel reclaims, then its OOM killer stops the
  group's largest process (a kernel, or the learner's embedded Triton); ``memory.oom_control``
  counts those kills (``oom_kill``), which is how the learner's next cell can say what happened;
* **pids** ``pids.max``: a fork or a new thread past it fails with EAGAIN (threads count: Triton, its
  stubs and the frameworks' thread pools are most of a learner's tasks); ``pids.events`` counts the
  refusals;
* **pids**, for the learner's outward forwarders (``network.py``): a group inside theirs whose
  ``pids.max`` caps the connections they relay (:attr:`LearnerLimits.forwarder_tasks`), with one
  group per half of the relay inside it (:data:`HALVES`: the namespace's side and the machine's), each
  capped at its share (:attr:`LearnerLimits.half_tasks`). Why two: a connection needs a relay on
  each side, and with one shared cap the namespace side's relays could take every task first, leaving
  the machine's side none to fork its half: the flooder's connections were then all reset (2 of ~40
  floods here). The learner's own ``pids.max`` counts them too, and their ``pids.events`` counts only
  the learner's own refused forks (cgroup v1 counts a refusal in the group that forked: a half's), so
  a kernel's notice never blames their processes for their connections;
* **cpu** ``cpu.shares``: a weight, not a cap. Every learner's group gets the same, so under
  contention a learner with 200 busy threads gets no more CPU than one with two, and an idle
  machine is still all theirs. The class's own group weighs their shares added up
  (:func:`weigh_class`): each learner counts as one ordinary process against the rest of the machine.

Sizes (:class:`LearnerLimits`, from docs/scale.md's footprints): a learner's heaviest lesson (05, the
three framework stubs) peaks at about 1.9 GB with JupyterLab, so 4 GiB leaves room for the kernel's
own arrays. The process limit counts tasks (threads too), see :data:`DEFAULT_TASKS`.

Each learner's groups sit under the hub's own (``/proc/self/cgroup``): on a machine that puts the
class inside a group of its own, the learners stay inside it.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import LabBackendsError
from lab_backends.waiting import poll

CGROUP_FS = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "lab-class"
#: weigh_class's read-then-write, one thread at a time (the hub creates learners' groups from threads).
_WEIGHING = threading.Lock()
GIB = 1 << 30
#: Tasks (processes and threads) a learner may hold. Measured here (2 cores): lesson 05 under nbval, its
#: kernel, embedded Triton and three framework stubs, peaked at 7 processes and 185 tasks (1.7 GiB); with
#: JupyterLab's own threads a learner stays near 250. 1024 is 4x that; thread pools grow with cores, so
#: raise it on bigger machines (``class start --learner-tasks``).
DEFAULT_TASKS = 1024
#: Concurrent connections a learner's forwarders relay (network.py). The lessons' largest legitimate
#: concurrency is a load of 16 requests in flight (lesson 03's ``concurrency=16``; lesson 09's 16 threads),
#: besides a JupyterLab's few connections (its page, a websocket per kernel and terminal) and the hub's API:
#: 64 is 4x the load and leaves the browser its share.
DEFAULT_CONNECTIONS = 64
#: The pids sub-group of a learner's forwarders (inside their own pids group: their tasks count twice, there and
#: in the learner's ``pids.max``).
FORWARDERS = "forwarders"
#: The groups inside :data:`FORWARDERS`, one per half of every relayed connection: its relays inside the
#: learner's namespace, and those outside, in the machine's (module doc).
HALVES = ("inside", "outside")
#: Tasks of a learner's outward forwarders besides the per-connection relays: their listeners, two per port (a
#: class forwards four out: the hub's API and the door's HTTP, gRPC and metrics ports).
FORWARDER_LISTENERS = 8


class LimitsError(LabBackendsError):
    """A learner's cgroups could not be made or removed; the message says why and what to do."""


@dataclass(frozen=True)
class LearnerLimits:
    """What each learner may use (``class start --learner-memory/--learner-tasks/--learner-cpu-shares``)."""

    memory_bytes: int = 4 * GIB
    tasks: int = DEFAULT_TASKS
    cpu_shares: int = 1024  #: the kernel's default weight: every learner weighs the same
    connections: int = DEFAULT_CONNECTIONS  #: concurrent connections their forwarders relay (network.py)

    @property
    def forwarder_tasks(self) -> int:
        """The forwarders' ``pids.max``: each connection is relayed by two socat processes (one inside the
        learner's network namespace, one outside), plus the listeners."""
        return 2 * self.connections + FORWARDER_LISTENERS

    @property
    def half_tasks(self) -> int:
        """Each half's ``pids.max`` (:data:`HALVES`): a relay a connection, plus that side's listeners."""
        return self.connections + FORWARDER_LISTENERS // 2

    def describe(self) -> str:
        return (f"{self.memory_bytes / GIB:g} GiB of memory, {self.tasks} processes and threads, "
                f"CPU shares {self.cpu_shares}, {self.connections} connections")


def own_group(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> Path:
    """This process's group of ``controller`` (cgroup v1), as a folder under ``/sys/fs/cgroup``."""
    for line in Path(proc_cgroup).read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_FS / controller / path.lstrip("/")
    raise LimitsError(f"no cgroup v1 '{controller}' hierarchy for this process ({proc_cgroup}): a class's learner "
                      f"limits need cgroup v1's memory, pids and cpu controllers mounted under {CGROUP_FS}")


#: Joins the groups named in ``$0`` (their folders, space-separated), then runs the rest of its command line.
_JOIN = 'for g in $0; do echo $$ > "$g/cgroup.procs"; done; exec "$@"'


def join_command(groups: list[Path]) -> list[str]:
    """A command prefix that runs the rest of the command inside ``groups`` (what the spawner's first shell does)."""
    return ["sh", "-c", _JOIN, " ".join(map(str, groups))]


def learner_groups(user: str) -> list[Path]:
    """The learner's group in each controller (under this process's own group)."""
    return [own_group(c) / PARENT / user for c in CONTROLLERS]


def forwarder_groups(user: str, half: str) -> list[Path]:
    """Where one half (:data:`HALVES`) of the learner's outward forwarders runs: the learner's memory and cpu
    groups, and that half's pids group inside the forwarders' (whose ``pids.max`` is the connection cap), inside
    the learner's (whose ``pids.max`` still counts them)."""
    if half not in HALVES:
        raise ValueError(f"a forwarder half is one of {HALVES}, not {half!r}")
    memory, pids, cpu = learner_groups(user)
    return [memory, pids / FORWARDERS / half, cpu]


def forwarders_group(user: str) -> Path:
    """The pids group of all the learner's outward forwarders (both halves' groups are inside it)."""
    return learner_groups(user)[1] / FORWARDERS


def create(user: str, limits: LearnerLimits) -> list[Path]:
    """The learner's groups, made (a stale one emptied and made again) and limited; their folders.

    The forwarders' pids group (:func:`forwarders_group`) is made inside the learner's, limited to
    :attr:`LearnerLimits.forwarder_tasks`, and each half's inside it (:func:`forwarder_groups`), limited to
    :attr:`LearnerLimits.half_tasks`."""
    remove(user)
    groups = learner_groups(user)
    values = {"memory": {"memory.limit_in_bytes": limits.memory_bytes},
              "pids": {"pids.max": limits.tasks},
              "cpu": {"cpu.shares": limits.cpu_shares}}
    try:
        for controller, group in zip(CONTROLLERS, groups):
            group.mkdir(parents=True, exist_ok=True)
            for name, value in values[controller].items():
                (group / name).write_text(str(value))
        forwarders = forwarders_group(user)
        forwarders.mkdir(exist_ok=True)
        (forwarders / "pids.max").write_text(str(limits.forwarder_tasks))
        for half in HALVES:
            (forwarders / half).mkdir(exist_ok=True)
            (forwarders / half / "pids.max").write_text(str(limits.half_tasks))
        weigh_class()
    except OSError as exc:
        remove(user)
        raise LimitsError(f"could not limit {user}'s processes ({exc}): class start needs root and writable "
                          f"cgroup v1 controllers under {CGROUP_FS}") from None
    return groups


def weigh_class() -> int:
    """Give the class's own cpu group (``lab-class``) the sum of its learners' shares; that sum.

    Why: cpu.shares weigh siblings. The learners' groups are siblings under ``lab-class``, which is itself
    one sibling among the machine's other processes, at the default 1024: all learners together weighed
    as much as *one* busy process elsewhere. Measured: beside one busy loop, three sandboxed learners ran
    the lessons in 515 s (243 s without the loop; make test, 2026-12-03). With the sum, each learner weighs what
    one ordinary process does. Recomputed at every create and remove (the hub starts learners' sandboxes
    at once from threads: the lock makes the last write the one that counted every group).
    """
    parent = own_group("cpu") / PARENT
    with _WEIGHING:
        total = sum(int((g / "cpu.shares").read_text()) for g in parent.iterdir() if (g / "cpu.shares").is_file())
        total = min(max(total, 1024), 262144)  # the kernel's range is 2..262144; never below one process's weight
        (parent / "cpu.shares").write_text(str(total))
    return total


def remove(user: str, timeout_s: float = 10.0) -> None:
    """Kill what is left in the learner's groups (by PID) and remove them, then weigh the class again; idempotent."""
    inner = [forwarders_group(user) / half for half in HALVES]
    groups = [group for group in [*inner, forwarders_group(user), *learner_groups(user)] if group.is_dir()]
    for group in groups:  # the innermost groups first: a parent can be removed only once its children are gone
        for pid in members(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        poll(lambda: members(group), lambda left: not left, timeout_s, 0.05)
        try:
            group.rmdir()
        except OSError as exc:
            raise LimitsError(f"could not remove {group} ({exc}): processes {members(group)} are still in it") from None
    if groups:
        weigh_class()



def members(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def counter(path: Path, name: str) -> int:
    """A ``name value`` line of a cgroup file (``oom_kill`` of memory.oom_control, ``max`` of pids.events)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except OSError:
        pass
    return 0
