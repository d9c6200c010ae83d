"""The front door's ports, taken first, and tritonserver in a network namespace of its own behind them.

Why: every local user can connect to every port on the machine's 127.0.0.1, so a door that
tritonserver's own ports bypass guards nothing against them, and Triton's admin key (a command-line
flag, readable in ``ps``) opens those ports to anyone. A network namespace has a loopback of its own
that nobody outside it can reach. So ``serve --front-door``, as root:

1. binds the door's public ports here, in the machine's namespace (:func:`take_ports`), before
   anything else runs, and holds them until it exits (through every restart of tritonserver);
2. moves itself into a new network namespace (``unshare(2)`` with ``CLONE_NEWNET``; its loopback
   brought up with iproute2's ``ip``): tritonserver, its stubs and the watchdog start there as
   children, on that namespace's 127.0.0.1, with no admin key at all (only the door reaches them);
3. hands the bound sockets to nginx, which takes listening sockets from its ``NGINX`` environment
   variable (the mechanism of its binary upgrade, nginx ``src/core/nginx.c`` ``ngx_add_inherited_sockets``):
   a socket keeps the namespace it was made in, so the door answers on the machine's loopback and
   connects to tritonserver on the namespace's own.

No address outside the machine is used: the new namespace has only its own loopback. ``unshare``
moves the calling thread: it is called from the main thread before serve starts any other (children
and later threads inherit it). Without root the ports are still taken first and handed over the same
way, and tritonserver stays on the machine's loopback, with its key (``serve`` says so).
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
from dataclasses import dataclass

from lab_backends.errors import FrontDoorError, PortInUseError
from lab_backends.server.ports import LOCALHOST

CLONE_NEWNET = 0x40000000
BACKLOG = 4096


@dataclass(frozen=True)
class PublicPorts:
    """The door's listening sockets (HTTP, gRPC, metrics), bound in the machine's network namespace."""

    http: socket.socket
    grpc: socket.socket
    metrics: socket.socket
    #: True once this process (and so tritonserver) lives in a network namespace of its own.
    isolated: bool = False

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self.http, self.grpc, self.metrics)

    def port(self, which: str) -> int:
        return getattr(self, which).getsockname()[1]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def take_ports(http: int | None, grpc: int | None, metrics: int | None, host: str = LOCALHOST) -> list[socket.socket]:
    """Bind and listen on the ports asked for (a free one for each ``None``), in this namespace."""
    taken: list[socket.socket] = []
    try:
        for port in (http, grpc, metrics):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart's TIME_WAIT is no obstacle
            try:
                sock.bind((host, port or 0))
            except OSError:
                sock.close()
                raise PortInUseError(f"the front door cannot listen on {host}:{port}: it is in use; choose another "
                                     "--http-port/--grpc-port/--metrics-port or stop what holds it") from None
            sock.listen(BACKLOG)
            taken.append(sock)
    except BaseException:
        for sock in taken:
            sock.close()
        raise
    return taken


def public_ports(http: int | None, grpc: int | None, metrics: int | None) -> PublicPorts:
    """Take the door's ports here; then, as root, move this process into a network namespace of its own."""
    ports = PublicPorts(*take_ports(http, grpc, metrics), isolated=os.geteuid() == 0)
    if ports.isolated:
        try:
            enter_private_network()
        except BaseException:
            ports.close()
            raise
    return ports


def enter_private_network() -> None:
    """``unshare(CLONE_NEWNET)`` for this thread, then its loopback up (a new namespace's is down)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise FrontDoorError(f"could not give tritonserver a network namespace of its own: {os.strerror(errno)} "
                             "(it needs root: CAP_SYS_ADMIN)")
    up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True, timeout=30)
    if up.returncode != 0:
        raise FrontDoorError(f"could not bring up the namespace's loopback with `ip link set lo up` (iproute2): "
                             f"{up.stderr.strip()}")


def network_namespace(pid: int | str = "self") -> str:
    """The network namespace of a process, as the kernel names it (``net:[inode]``)."""
    return os.readlink(f"/proc/{pid}/ns/net")
