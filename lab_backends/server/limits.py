"""What a ``tritonserver`` child gets before it execs: more file descriptors, and death with its parent.

* **Open files**: every connection costs the server a descriptor, and sockets of clients that gave
  up linger in CLOSE-WAIT (Triton 2.51 never closes them). At a soft limit of 1,024 (a common
  desktop default) it then refuses all traffic, spins at 100 % CPU and floods its log. The hard
  limit is usually far higher and raising the soft one up to it needs no privilege.
* **Parent death**: the watchdog stops the server when its owner dies, but if both are killed at
  once (``kill -9`` of the CLI and its watchdog) nothing would. ``PR_SET_PDEATHSIG`` makes the
  kernel send SIGTERM to the server when the thread that started it dies. Because it is the
  *thread*, not the process, it is only set when the server is started from the main thread: a
  server started from a worker thread must not die when that thread ends.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import threading
from typing import Callable

import psutil

PR_SET_PDEATHSIG = 1
#: The kernel's ceiling for RLIMIT_NOFILE when the hard limit is "unlimited". A kernel setting, not a
#: process's: psutil has no reader for it, so the sysctl file is read.
_NR_OPEN = "/proc/sys/fs/nr_open"

try:  # resolved in the parent: the child, between fork and exec, should only call it
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def nofile_target() -> int:
    """The soft RLIMIT_NOFILE a server should get: its hard limit (bounded by the kernel's nr_open)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        try:
            hard = int(open(_NR_OPEN).read())
        except (OSError, ValueError):
            hard = 1 << 20
    return hard


def child_setup(die_with_parent: bool | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: raise the soft fd limit; die with the parent thread.

    ``die_with_parent=None`` means: only when called from the main thread (see the module docstring).
    """
    if die_with_parent is None:
        die_with_parent = threading.current_thread() is threading.main_thread()
    target = nofile_target()
    parent = os.getpid()

    def _in_child() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < target:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                pass  # keep the old limit rather than fail the start
        if die_with_parent and _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return _in_child


def open_files_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of a running process of ours (for tests and diagnostics).

    Read with ``prlimit(2)`` through psutil, which needs the process to be ours (our servers are);
    ``resource.RLIM_INFINITY`` (-1) stands for unlimited.
    """
    soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
    return soft, hard
