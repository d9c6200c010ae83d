"""A small keep-alive HTTP/1.1 client on asyncio: resends one prepared message, checks the status.

Why hand-written: ``tritonclient.http`` (gevent) spends more CPU per request than the server on two
cores; this one only counts bytes to find where a response ends.
"""

from __future__ import annotations

import asyncio
import json


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection as a bare asyncio protocol.

    Streams (``readuntil`` + ``readexactly``) cost a few coroutine hops per response; here bytes
    land in ``data_received`` and complete one future when a whole response (``Content-Length``
    framed, as Triton always sends) is in. That halves the client's CPU per request.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is not None:
            self._complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"the server closed the connection ({exc or 'EOF'})"))
        self.waiter = None

    def _complete(self) -> None:
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buffer[: end + 2]).lower()
        at = head.find(b"\r\ncontent-length:")
        waiter = self.waiter
        if at < 0:
            self.waiter = None
            self.alive = False
            waiter.set_exception(ValueError("a response without Content-Length (not sent by Triton)"))
            return
        size = int(head[at + 17 : head.find(b"\r\n", at + 2)])
        total = end + 4 + size
        if len(buffer) < total:
            return
        status = int(buffer[9:12])
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        if b"\r\nconnection: close" in head:
            self.alive = False
        self.waiter = None
        waiter.set_result((status, body))

    async def exchange(self, message: bytes) -> tuple[int, bytes]:
        if not self.alive:
            raise ConnectionError("the connection is closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(message)
        return await self.waiter

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()


class HttpSender:
    """Keep-alive HTTP/1.1 connections, one per request in flight (HTTP/1.1 cannot multiplex)."""

    def __init__(self, url: str, message: bytes, timeout_s: float, max_connections: int) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port = host, int(port)
        self.message, self.timeout_s, self.max_connections = message, timeout_s, max_connections
        self.idle: list[HttpConnection] = []
        self.opened = 0
        self.freed: asyncio.Event | None = None

    async def open(self) -> None:
        self.freed = asyncio.Event()

    async def _acquire(self) -> HttpConnection:
        while True:
            while self.idle:
                connection = self.idle.pop()
                if connection.alive:
                    return connection
                self.opened -= 1  # closed by the server while idle
            if self.opened < self.max_connections:
                self.opened += 1
                try:
                    _, connection = await asyncio.get_running_loop().create_connection(
                        HttpConnection, self.host, self.port
                    )
                except BaseException:
                    self.opened -= 1
                    raise
                return connection
            self.freed.clear()
            await self.freed.wait()

    def _release(self, connection: HttpConnection) -> None:
        if connection.alive:
            self.idle.append(connection)
        else:
            self.opened -= 1
            connection.close()
        self.freed.set()

    async def send(self) -> str:
        try:
            connection = await self._acquire()
        except OSError as exc:
            return f"cannot connect to {self.host}:{self.port}: {exc}"
        try:
            status, body = await connection.exchange(self.message)
        except (OSError, ValueError) as exc:
            connection.close()
            self._release(connection)
            return f"HTTP connection failed: {exc!r}"
        except BaseException:
            connection.close()
            self._release(connection)
            raise
        self._release(connection)
        if status == 200:
            return ""
        try:
            error = json.loads(body).get("error", "")
        except ValueError:
            error = body[:200].decode(errors="replace")
        return f"HTTP {status}: {error}"

    async def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()
