"""A tiny guardian process: if the owner of a server dies, the server and its stubs die too.

A Jupyter kernel killed with SIGKILL runs no ``atexit`` and no ``finally``. The watchdog is a
separate process in its own session that polls two things: its parent (the owner) and the server.
When the owner disappears it stops the server's process group and removes the server's
``/dev/shm`` regions; when the server is gone it simply exits.

Run as ``python -m lab_backends.server.watchdog OWNER_PID SERVER_PID GRACE_S [LOG_PATH]``; with a log
path it also caps the server log (:mod:`lab_backends.server.logcap`), so a log storm cannot fill the disk.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from lab_backends.server.logcap import cap_log
from lab_backends.server.processes import (
    alive,
    children,
    group_members,
    remove_shm,
    reused,
    shm_regions,
    started_at,
    stop_group,
)

POLL_S = 0.2
#: Reading the stubs' command lines costs more than a liveness check: do it every N polls.
SHM_EVERY = 10


def watch(owner: int, server: int, grace_s: float, log: str | None = None) -> int:
    # The owner stops us (SIGTERM) after it has stopped the server: then every region we saw
    # belongs to a dead server, including those of stubs killed earlier that Triton never unlinks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the owner, not us
    seen: set[str] = set()
    try:
        return _loop(owner, server, grace_s, seen, log)
    finally:
        if not alive(server) and not group_members(server):
            remove_shm(seen)


def _loop(owner: int, server: int, grace_s: float, seen: set[str], log: str | None = None) -> int:
    # The server is its PID and its start time: once it is gone the PID may be another process's
    # (processes.py's docstring), whose group and regions are not ours.
    born = started_at(server)
    tick = 0
    while True:
        if not alive(server) or started_at(server) != born:
            # The server exited or crashed: its stubs must not linger as orphans, and their
            # shared-memory regions must not outlive them. Its group is its own while it has
            # members and no other process took the PID (the kernel reuses neither then).
            if not reused(server, born) and group_members(server):
                stop_group(server, 2.0, born=born)
            remove_shm(seen)
            return 0
        if tick % SHM_EVERY == 0:
            seen |= shm_regions([server, *children(server)])
            if log:
                cap_log(log)
        tick += 1
        if os.getppid() != owner or not alive(owner):
            stop_group(server, grace_s, born=born)
            remove_shm(seen)
            return 0
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    args = (argv or sys.argv[1:])
    owner, server, grace = args[:3]
    return watch(int(owner), int(server), float(grace), args[3] if len(args) > 3 else None)


if __name__ == "__main__":
    raise SystemExit(main())
