"""Each learner's JupyterLab as that learner, in a PID namespace of its own: why the admin key stays hidden.

Triton 2.51 takes its admin key only as a command-line flag (platform notes), and any local user
can read any process's command line in ``/proc/<pid>/cmdline``. JupyterHub's
``LocalProcessSpawner`` runs a learner's server as the learner, but on the machine's ``/proc``:
one ``cat /proc/*/cmdline`` in a notebook cell would print the key, and with it the
model-repository API (upload a ``model.py``, run it as the server's user).

So this spawner starts, as root, ``unshare --pid --fork --mount-proc --kill-child=SIGTERM`` (a new
PID namespace with its own ``/proc``, mounted in a private mount namespace: the machine's ``/proc``
is never remounted), and inside it drops to the learner with ``setpriv --reuid --regid
--init-groups --no-new-privs`` before ``dumb-init`` starts ``jupyterhub-singleuser``. Everything the learner
runs (kernels, terminals, their own embedded Triton) is a descendant of that server: they see only
their own processes, and a set-uid program cannot give them more. The key file is root's (0600),
and neither the hub's nor the learner's environment carries the key.

PID 1 of the namespace is ``dumb-init`` (the PyPI wheel ships the binary), not the single-user
server: a process whose parent exits (a server's watchdog after its kernel died, say) is re-parented
to PID 1, and only an init that waits for every child keeps it from staying a zombie until the
learner's server stops. ``dumb-init`` also passes the signals it gets on to the server's process
group, and exits with the server's status.

Signals: ``unshare`` blocks SIGINT and SIGTERM while it waits for its child, so the hub's stop
signals go to the namespace's first process (``dumb-init``, which passes them on); SIGKILL goes to
both. When that process exits, the kernel kills whatever is left in its namespace: no orphans.

A private ``/dev/shm``: before dropping to the learner, the namespace's root shell mounts a tmpfs of
its own over ``/dev/shm`` (a quarter of the machine's memory at most; ``unshare`` makes the new mount
namespace's propagation private, so the host never sees it). The Python backend creates its stubs'
regions there 0644 whatever the umask (``tests/reliability/test_security.py`` pins it), so on the
machine's ``/dev/shm`` any learner could read another's tensors, and the shared server's; inside, a
learner sees only the regions of their own embedded Triton and their own clients.

Who is who at the front door: the server's environment carries the learner's name and door token
(``lab_backends.learner``: made from the class's secret, which only root reads) and puts the
``with_key`` boot folder first on ``PYTHONPATH``, so every tritonclient call and every
``rest.request`` of the learner's kernels carries them; the door counts the request as theirs.

Around all this, each learner's sandbox (issue 38): the server starts inside the learner's cgroups
(``cgroups.py``: memory, tasks, CPU weight) and network namespace (``network.py``: only the hub's
API and the front door out, only their JupyterLab in; the forwarders that relay those connections run
within the learner's cgroups too, capped), with umask 077; both are made before it
starts and removed after it stops, and its kernels explain a limit that stopped something
(``PYTHONSTARTUP``: ``kernel_startup.py``).

On first start the course notebooks are copied into ``~/notebooks`` (owned by the learner).
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import shutil
import signal
import sys
from pathlib import Path

import psutil
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Integer, List, Unicode

from lab_backends import learner
from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.classroom.network import Confinement, LearnerNetwork, close_network, namespace_name, open_network
from lab_backends.classroom.settings import DUMB_INIT
from lab_backends.client.with_key import boot_pythonpath

#: Run by IPython in each of the learner's kernels (``PYTHONSTARTUP``): the class's limits explained.
KERNEL_STARTUP = Path(__file__).with_name("kernel_startup.py")
#: What is copied into a learner's home: the lessons and their exercises, not the test hooks.
_NOT_COPIED = shutil.ignore_patterns("conftest.py", ".ipynb_checkpoints", "__pycache__")


#: Run as root inside the new mount namespace, before dropping to the learner: when the interpreter
#: lives in a folder learners cannot enter (pyenv under /root, mode 0700), a tmpfs (0711) hides that
#: folder in *this namespace only*, and the interpreter's prefix is bound back at its own path.
_EXPOSE = """set -e
base=$1 hidden=$2; shift 2
mount -t tmpfs -o size=25%,mode=1777,nosuid,nodev lab-class-shm /dev/shm
if [ -n "$hidden" ]; then
  mount -t tmpfs -o size=1m,mode=0755 lab-class /mnt && mkdir /mnt/python && mount --bind "$base" /mnt/python
  mount -t tmpfs -o size=1m,mode=0711 lab-class "$hidden" && mkdir -p "$base" && mount --bind /mnt/python "$base"
fi
umask 077
exec "$@"
"""


def hidden_interpreter(prefix: str = sys.base_prefix) -> tuple[str, str]:
    """(the interpreter's real prefix, its first ancestor that others cannot enter) or (prefix, "")."""
    base = Path(os.path.realpath(prefix))
    for parent in reversed(base.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return str(base), str(parent)
    return str(base), ""


def namespace_command(user: str, command: list[str]) -> list[str]:
    """``command`` run as ``user`` under ``dumb-init`` in a new PID namespace with its own ``/proc`` (from root),
    with umask 077."""
    base, hidden = hidden_interpreter()
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM", "--",
            "sh", "-c", _EXPOSE, "sh", base, hidden,
            "setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups",
            "--inh-caps=-all", "--no-new-privs", "--", str(DUMB_INIT), "--", *command]


def copy_course(source: Path, home: Path, user: str) -> Path | None:
    """``source`` copied to ``home/notebooks`` owned by ``user``, once; ``None`` when it was there."""
    target = home / "notebooks"
    if target.exists():
        return None
    entry = pwd.getpwnam(user)
    shutil.copytree(source, target, ignore=_NOT_COPIED)
    for path in [target, *target.rglob("*")]:
        os.lchown(path, entry.pw_uid, entry.pw_gid)
    return target


def in_group(user: str, group: str) -> bool:
    """Whether ``user`` belongs to ``group`` (as a member, or as its primary group)."""
    try:
        entry, members = pwd.getpwnam(user), grp.getgrnam(group)
    except KeyError:
        return False
    return user in members.gr_mem or entry.pw_gid == members.gr_gid


class NamespaceSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` whose server runs in its own PID namespace, as the learner (see module doc)."""

    class_group = Unicode("lab-class", config=True, help="only members of this Unix group get a server")
    course_dir = Unicode("", config=True, help="copied into ~/notebooks on a learner's first start")
    learners_secret_file = Unicode("", config=True, help="the class's secret: each learner's door token is made "
                                   "from it (root only)")
    outward_ports = List(Integer(), config=True, help="the machine's ports a learner's namespace reaches: the hub's "
                         "API and the front door's (network.py)")
    learner_memory = Integer(LearnerLimits.memory_bytes, config=True, help="bytes of memory per learner (cgroups.py)")
    learner_tasks = Integer(LearnerLimits.tasks, config=True, help="processes and threads per learner")
    learner_cpu_shares = Integer(LearnerLimits.cpu_shares, config=True, help="each learner's CPU weight")
    learner_connections = Integer(LearnerLimits.connections, config=True, help="concurrent connections each "
                                  "learner's forwarders relay (network.py)")
    network: LearnerNetwork | None = None

    def make_preexec_fn(self, name):
        """Stay root in the child: ``unshare`` needs it, and ``setpriv`` drops to the learner after."""
        return None

    def user_env(self, env: dict) -> dict:
        env = super().user_env(env)
        env["SHELL"] = "/bin/bash"  # the account's login shell is nologin: the hub is the only way in
        env["LAB_RUNS_DIR"] = str(Path(env["HOME"]) / ".lab-backends" / "runs")  # their own Triton's runs
        env["LAB_SCRATCH_DIR"] = str(Path(env["HOME"]) / ".lab-backends" / "build")  # what lessons 09, 09b build
        env["PYTHONSTARTUP"] = str(KERNEL_STARTUP)  # every kernel explains the class's limits (limits_notice.py)
        if self.learners_secret_file:
            secret = Path(self.learners_secret_file).read_text(encoding="utf-8").strip()
            env[learner.LEARNER_VAR] = self.user.name
            env[learner.TOKEN_VAR] = learner.token_for(secret, self.user.name)
            env["PYTHONPATH"] = boot_pythonpath(env)
        return env

    async def start(self):
        name = self.user.name
        if not in_group(name, self.class_group):
            raise RuntimeError(f"{name} is not a learner of this class (Unix group {self.class_group}): "
                               f"add them with `lab-backends class add-learners ROSTER`")
        home = Path(pwd.getpwnam(name).pw_dir)
        if self.course_dir and copy_course(Path(self.course_dir), home, name):
            self.log.info("copied the course notebooks into %s/notebooks", home)
        self.popen_kwargs = {**self.popen_kwargs, "cwd": str(home)}
        await self.close_sandbox()  # a previous server's, if the hub lost track of it
        self.port = random_port()  # bound twice: inside the learner's namespace, and by the proxy's forwarder here
        limits = LearnerLimits(self.learner_memory, self.learner_tasks, self.learner_cpu_shares,
                               self.learner_connections)
        plain = list(self.cmd)
        try:
            groups = await asyncio.to_thread(cgroups.create, name, limits)
            # The forwarders run within the learner's limits, relaying as them inside (network.py: issue 46).
            confinement = Confinement.of(name, groups)
            self.network = await asyncio.to_thread(open_network, name, [self.port], list(self.outward_ports),
                                                   confinement)
            self.cmd = [*cgroups.join_command(groups), *self.network.enter(), *namespace_command(name, plain)]
            self.log.info("%s's sandbox: network namespace %s, limits %s", name, self.network.name, limits.describe())
            return await super().start()
        except BaseException:
            await self.close_sandbox()
            raise
        finally:
            self.cmd = plain

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        await self.close_sandbox()

    async def close_sandbox(self) -> None:
        """The learner's forwarders, network namespace and cgroups, removed (idempotent; by PID and by name)."""
        network = self.network or LearnerNetwork(namespace_name(self.user.name))
        await asyncio.to_thread(close_network, network)
        await asyncio.to_thread(cgroups.remove, self.user.name)
        self.network = None

    def get_state(self) -> dict:
        state = super().get_state()
        if self.network is not None:
            state["network"] = self.network.to_state()  # a restarted hub can still stop the forwarders
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        if "network" in state:
            self.network = LearnerNetwork.from_state(state["network"])

    def namespace_init(self) -> int | None:
        """The host PID of the namespace's first process (``dumb-init``), if it runs."""
        try:
            kids = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return None
        return kids[0].pid if kids else None

    async def _signal(self, sig: int) -> bool:
        if sig == 0 or not self.pid:
            return await super()._signal(sig)
        init = self.namespace_init()
        for pid in ([init] if init else []) + ([self.pid] if sig == signal.SIGKILL or not init else []):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return await super()._signal(0)
