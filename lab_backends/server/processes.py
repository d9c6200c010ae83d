"""Stopping a server *and its stubs* by PID, and cleaning what they leave in ``/dev/shm``.

``tritonserver`` runs in its own session, so it and the Python backend stubs that it forks share
one process group: that group is what we stop. A stub killed hard leaves its shared-memory region
behind; its name is on the stub's command line, so we record names while the stubs are alive and
remove exactly those files afterwards (never another server's).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from lab_backends.waiting import poll

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (read from /proc, no psutil needed)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # fields after the ")" that closes the command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the stubs of a server), cheaply, from /proc/<pid>/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def shm_regions(pids: list[int]) -> set[str]:
    """Python-backend shared-memory regions of these processes.

    A stub names its region on its command line; the server holds every region of its stubs open
    (also the region of a stub that was killed), so its open files are read too.
    """
    names = set()
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            names.update(a.decode() for a in args if a.startswith(SHM_PREFIX.encode()))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"{SHM_DIR}/{SHM_PREFIX}"):
                    names.add(target.rsplit("/", 1)[1].split(" ")[0])
        except OSError:
            continue
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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text()
        return state[state.rfind(")") + 2] != "Z"
    except OSError:
        return False


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pid: int, grace_s: float, reap=None) -> set[str]:
    """SIGTERM the server, wait ``grace_s``, then SIGKILL the whole group; clean its shm files.

    ``reap`` is called while waiting (e.g. ``Popen.poll``) so a child of ours does not linger as a
    zombie. Returns the shm names that were removed.
    """
    shm = shm_regions(group_members(pid))
    if alive(pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def gone() -> bool:
        nonlocal shm
        if reap:
            reap()
        members = group_members(pid)
        shm |= shm_regions(members)
        return not alive(pid) and not members

    poll(gone, bool, grace_s)
    kill_group(pid, signal.SIGKILL)
    poll(gone, bool, 5.0)
    return set(remove_shm(shm))
