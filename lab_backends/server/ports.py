"""Free ports on 127.0.0.1, and how to tell that one is taken."""

from __future__ import annotations

import socket

LOCALHOST = "127.0.0.1"


def free_ports(count: int, host: str = LOCALHOST) -> list[int]:
    """Ask the kernel for ``count`` distinct free ports (held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_is_free(port: int, host: str = LOCALHOST) -> bool:
    """Whether a server could listen on ``port`` now.

    SO_REUSEADDR, as every server sets it: a port left in TIME_WAIT by a server that just stopped
    is free to listen on again (without it a restart on fixed ports failed for ~60 s).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
