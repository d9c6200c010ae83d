"""Stopping a server *and its stubs* by PID, and cleaning what they leave in ``/dev/shm``.

``tritonserver`` runs in its own session, so it and the Python backend stubs that it forks share
one process group: that group is what we stop. A stub killed hard leaves its shared-memory region
behind; its name is on the stub's command line, so we record names while the stubs are alive and
remove exactly those files afterwards (never another server's).

Processes are read with :mod:`psutil`, here and, through :func:`command_line` and :func:`mapped_files`,
in the rest of the package: nothing reads ``/proc`` by hand. They come and go while we look (a stub exits, a server is
being stopped): one that vanishes meanwhile is skipped, never an error, and a zombie (exited, not
yet reaped) counts as gone. These functions are polled in loops (the watchdog, ``stop_group``), so
they read no more than they need: ``group_members`` asks every process only for its process group
(one system call, :func:`os.getpgid`, as psutil has no such attribute) and reads the state of
members alone.

PIDs are reused, and soon on a machine whose ``pid_max`` is 32768 (this one) while thousands of processes
and threads come and go (a class's forwarders under a learner's 5,000 connections): a process is named by
its PID *and its start time* (:func:`started_at`), and a process group is signalled only while it still
exists. The kernel gives no new process a PID that is still some group's ID, so a group with members is
still ours; once its last member is gone its ID may be a new process's, whose group a late ``killpg``
would kill and whose ``/dev/shm`` regions a late look would take for ours (seen in a fresh clone's
``make test``: a stub of another test's server found its region gone, "No such file or directory").
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from lab_backends.waiting import poll

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
#: What a process that is gone, or not ours to read, raises while we look at it.
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # psutil.ZombieProcess is a NoSuchProcess


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie is dead for our purposes, one we may not read is alive."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid``, zombies left out."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
        except OSError:  # gone meanwhile
            continue
        if alive(pid):
            members.append(pid)
    return members


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the stubs of a server); none when ``pid`` is gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except _GONE:
        return []


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments; none when it is gone, a zombie, or not ours to read."""
    try:
        return psutil.Process(pid).cmdline()
    except _GONE:
        return []


def mapped_files(pid: int) -> set[str]:
    """Paths of the files ``pid`` has mapped into memory; none when it is gone or not ours to read.

    A mapped file that was deleted since keeps its old path (psutil drops the kernel's ``(deleted)``
    mark): check that a path exists before acting on it.
    """
    try:
        return {region.path for region in psutil.Process(pid).memory_maps()}
    except _GONE:
        return set()


def shm_regions(pids: list[int]) -> set[str]:
    """Python-backend shared-memory regions of these processes.

    A stub names its region on its command line; the server holds every region of its stubs open
    (also the region of a stub that was killed), so its open files are read too.
    """
    names: set[str] = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            names.update(arg for arg in process.cmdline() if arg.startswith(SHM_PREFIX))
        except _GONE:
            continue
        try:
            files = process.open_files()
        except _GONE:  # exited meanwhile, or another user's process: its command line is what we get
            continue
        for file in files:
            path = Path(file.path)
            if path.parent == SHM_DIR and path.name.startswith(SHM_PREFIX):
                names.add(path.name)
    return names


def remove_shm(names: set[str]) -> list[str]:
    removed = []
    for name in names:
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def started_at(pid: int) -> float | None:
    """When ``pid`` started (psutil's ``create_time``), or ``None`` when no such process runs: with the PID,
    what tells a process from a later one that reused its PID."""
    try:
        return psutil.Process(pid).create_time()
    except _GONE:
        return None


def stop_group(pid: int, grace_s: float, reap=None, born: float | None = None) -> set[str]:
    """SIGTERM the server, wait ``grace_s``, then SIGKILL its group if it still exists; clean its shm files.

    ``reap`` is called while waiting (e.g. ``Popen.poll``) so a child of ours does not linger as a
    zombie. ``born``: the server's :func:`started_at`, when the caller knew it before now (the watchdog):
    a process that took the PID since is left alone. Returns the shm names that were removed. Once the
    group is gone nothing is read or signalled by its ID again (the module docstring: the ID may then be
    another process's).
    """
    born = started_at(pid) if born is None else born

    def leader() -> bool:
        return born is not None and alive(pid) and started_at(pid) == born

    def ours() -> list[int]:
        return group_members(pid) if leader() or not reused(pid, born) else []

    shm = shm_regions(ours())
    if leader():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    finished = False

    def gone() -> bool:
        nonlocal shm, finished
        if finished:
            return True
        if reap:
            reap()
        members = ours()
        shm |= shm_regions(members)
        finished = not leader() and not members
        return finished

    poll(gone, bool, grace_s)
    if not finished:
        kill_group(pid, signal.SIGKILL)
        poll(gone, bool, 5.0)
    return set(remove_shm(shm))


def reused(pid: int, born: float | None) -> bool:
    """``pid`` now names another process than the one that started at ``born``."""
    now = started_at(pid)
    return now is not None and now != born


def terminate(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    """Stop a child we started as a process manager would: SIGTERM, then SIGKILL after ``grace_s``.

    For one process we hold a ``Popen`` of (``lab-backends serve`` in a test, say); returns its
    exit code. Its own children are its business (``serve`` stops its server on SIGTERM).
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def stop_processes(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM each of these processes (ours), wait up to ``grace_s``, then SIGKILL what is left.

    A process that ends on its own meanwhile is skipped. For a set found by walking (a learner's
    processes, a test's leftovers); for one ``Popen`` we hold, :func:`terminate`.
    """
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
