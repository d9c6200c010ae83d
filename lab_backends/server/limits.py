"""What a ``tritonserver`` child gets: more file descriptors, death with its parent, a private umask, and no
Python before exec.

* **Open files**: every connection costs the server a descriptor, and sockets of clients that gave
  up linger in CLOSE-WAIT (Triton 2.51 never closes them). At a soft limit of 1,024 (a common
  desktop default) it then refuses all traffic, spins at 100 % CPU and floods its log. The hard
  limit is usually far higher and raising the soft one up to it needs no privilege. It is raised
  with ``prlimit(2)`` on the child right after the spawn, long before it accepts its first
  connection (it answers nothing until it is ready, and readiness is polled afterwards).
* **Parent death**: the watchdog stops the server when its owner dies, but if both are killed at
  once (``kill -9`` of the CLI and its watchdog) nothing would. ``PR_SET_PDEATHSIG`` makes the
  kernel send SIGTERM to the server when the thread that started it dies. Because it is the
  *thread*, not the process, it is only set when the server is started from the main thread: a
  server started from a worker thread must not die when that thread ends. util-linux's
  ``setpriv --pdeathsig SIGTERM`` sets it and execs the server (the setting survives ``execve``);
  without ``setpriv`` the watchdog alone covers the owner's death.
* **umask 077**: what the server and its stubs create (trace files, a model's own records) is their
  owner's alone. Not the Python backend's shared-memory regions: boost.interprocess sets their 0644
  with ``fchmod`` after creating them, past any umask (pinned by
  ``tests/reliability/test_security.py``); only a private ``/dev/shm`` keeps those from other users.
  ``subprocess.Popen(umask=...)`` sets it in C between fork and exec (CPython's ``_posixsubprocess``),
  which keeps the vfork path: no Python runs in the child.
* **Why no ``preexec_fn``**: a ``preexec_fn`` makes ``subprocess`` fork (instead of vfork) and run
  Python's at-fork handlers in the child. In a process that has used gRPC (a notebook kernel with
  ``tritonclient.grpc``), grpcio's fork support then restarts its event-engine poller in the child,
  ``close_fds`` closes the poller's epoll descriptor, and the child aborts before ``exec``:
  ``Epoll1Poller ... epoll_wait error: Bad file descriptor``, exit -6 (grpc/grpc issue 43055; grpcio
  1.85.3 here). Measured on this machine: 41 of 3,000 spawns of ``/bin/true`` aborted with a no-op
  ``preexec_fn`` after one gRPC call, 0 of 3,000 without (a ``make flake`` round lost a notebook's
  server start to it). :func:`spawn` therefore runs nothing in the child.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import threading
from typing import Any

import psutil

#: The kernel's ceiling for RLIMIT_NOFILE when the hard limit is "unlimited". A kernel setting, not a
#: process's: psutil has no reader for it, so the sysctl file is read.
_NR_OPEN = "/proc/sys/fs/nr_open"

def nofile_target() -> int:
    """The soft RLIMIT_NOFILE a server should get: its hard limit (bounded by the kernel's nr_open)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        try:
            hard = int(open(_NR_OPEN).read())
        except (OSError, ValueError):
            hard = 1 << 20
    return hard


def launch_prefix(die_with_parent: bool | None = None) -> list[str]:
    """The exec wrapper that sets ``PR_SET_PDEATHSIG`` for the server: ``setpriv --pdeathsig SIGTERM --``.

    ``die_with_parent=None`` means: only when called from the main thread (see the module docstring).
    Empty when not wanted, or when util-linux's ``setpriv`` is missing (the watchdog still covers).
    """
    if die_with_parent is None:
        die_with_parent = threading.current_thread() is threading.main_thread()
    setpriv = shutil.which("setpriv") if die_with_parent else None
    return [setpriv, "--pdeathsig", "SIGTERM", "--"] if setpriv else []


def raise_open_files(pid: int) -> None:
    """Raise the soft RLIMIT_NOFILE of process ``pid`` (ours) to :func:`nofile_target`; keep it if refused."""
    try:
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        target = nofile_target()
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(target, hard) if hard != resource.RLIM_INFINITY
                                                           else target, hard))
    except (ValueError, OSError):
        pass  # a process that already exited, or a limit we may not set: keep the old one rather than fail


#: The server's umask (see the module docstring): what it creates is its owner's alone.
SERVER_UMASK = 0o077


def spawn(command: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen`` for a server: dies with this thread, fd limit raised, umask 077, nothing run in it."""
    if "preexec_fn" in popen:
        raise TypeError("spawn() runs nothing between fork and exec (see the module docstring): no preexec_fn")
    popen.setdefault("umask", SERVER_UMASK)
    process = subprocess.Popen([*launch_prefix(), *command], **popen)
    raise_open_files(process.pid)
    return process


def open_files_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of a running process of ours (for tests and diagnostics).

    Read with ``prlimit(2)`` through psutil, which needs the process to be ours (our servers are);
    ``resource.RLIM_INFINITY`` (-1) stands for unlimited.
    """
    soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
    return soft, hard
