"""The gateway's upstreams under ``serve --standby``: which tritonserver gets a request, and sequences lost in a crash.

Two tritonservers with the same models serve behind the door (:mod:`lab_backends.server.standby`). The
gateway (:mod:`door_gateway`) relays every inference request to the *active* one and, when that one
cannot be reached (connection refused or reset: it crashed), to the other, which becomes the active one
and stays so (the crashed one, restarted by ``serve``, is the standby from then on: nothing fails back,
so a server is never left while it serves). Stateless requests are simply sent again there: one that the
dead server had begun was answered to nobody, and inference without sequence state gives the same
answer twice.

Sequences cannot move: a sequence's state lives in the one server that runs it (the sequence batcher
keeps it per correlation ID, core ``src/sequence_batch_scheduler/sequence_batch_scheduler.cc`` at r24.10).
So :class:`Failover` remembers, for each live sequence (model, correlation ID), the server it started on
and that server's PID (``serve`` writes the PIDs to ``servers_file`` after each start). Its later requests
go to that server; once that PID is gone (a crash; ``serve`` restarted it with a new PID), a request
without ``sequence_start`` gets :data:`LOST` instead of an answer computed from a fresh state. A new
START works at once (on the active server). The book is bounded: :data:`MAX_SEQUENCES` entries, the
least recently used dropped first, an entry leaves on ``sequence_end``; a sequence the book forgot is
relayed as before (the server then answers as Triton does for an unknown sequence).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from lab_backends.server.door_rules import Refusal

#: What a learner reads for a request of a sequence whose server crashed (HTTP 400, gRPC INVALID_ARGUMENT).
LOST = "the server restarted after a crash: sequence {cid}'s state is lost, start it again with sequence_start"
#: An HTTP infer request's path (door_gateway's): its model.
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
#: Live sequences remembered at most (about 200 bytes each).
MAX_SEQUENCES = 65536
#: How long a request waits for the other server's gRPC connection when the active one fails.
CONNECT_S = 1.0
#: How often ``servers_file`` is looked at again (a stat) while sequences are relayed.
RELOAD_S = 0.2


@dataclass(frozen=True)
class Upstream:
    """One tritonserver behind the gateway: its HTTP and gRPC ports."""

    http_port: int
    grpc_port: int


@dataclass(frozen=True)
class SequenceStep:
    """What a request says about its sequence: model, correlation ID (int or str), its START/END flags."""

    model: str
    cid: int | str
    start: bool
    end: bool

    @property
    def key(self) -> tuple[str, int | str]:
        return (self.model, self.cid)


def http_step(raw_path: str, headers: dict[str, str], body: bytes) -> SequenceStep | None:
    """The sequence fields of an HTTP infer body (JSON, or a binary body's JSON header); ``None``: none."""
    found = INFER_PATH.match(urllib.parse.unquote(raw_path.split("?", 1)[0]))
    if found is None:
        return None
    model = found.group(1)
    length = {k.lower(): v for k, v in headers.items()}.get("inference-header-content-length", "").strip()
    header = body[:int(length)] if length.isdigit() else body
    if b"sequence_id" not in header:
        return None  # most requests: no JSON parse here
    try:
        params = json.loads(header).get("parameters") or {}
    except (ValueError, AttributeError, RecursionError):
        return None  # door_rules refused it already, or Triton names the fault
    return _step(model, params.get("sequence_id"), params.get("sequence_start"), params.get("sequence_end"))


def grpc_step(message: bytes) -> SequenceStep | None:
    """The sequence fields of a ``ModelInferRequest`` (its ``parameters`` map), parsed only when it names one."""
    if b"sequence_id" not in message:
        return None
    try:
        request = service_pb2.ModelInferRequest.FromString(message)
    except DecodeError:
        return None
    params = request.parameters
    if "sequence_id" not in params:
        return None

    def value(name: str) -> Any:
        if name not in params:
            return None
        which = params[name].WhichOneof("parameter_choice")
        return getattr(params[name], which) if which else None

    return _step(request.model_name, value("sequence_id"), value("sequence_start"), value("sequence_end"))


def _step(model: str, cid: Any, start: Any, end: Any) -> SequenceStep | None:
    if cid in (None, 0, "") or not isinstance(cid, (int, str)) or isinstance(cid, bool):
        return None  # 0 / "": no sequence (Triton's own meaning)
    # gRPC's int64 and HTTP's uint64 name one sequence: Triton keeps the uint64 (door_sequences.py).
    return SequenceStep(model, cid % (1 << 64) if isinstance(cid, int) else cid, start is True, end is True)


class Failover:
    """The upstreams in order of preference, the active one, and the book of live sequences."""

    def __init__(self, upstreams: list[Upstream], servers_file: str | None, host: str = "127.0.0.1") -> None:
        self.upstreams, self.host = upstreams, host
        self.active = 0
        self.servers_file = Path(servers_file) if servers_file else None
        self._pids: list[int | None] = [None] * len(upstreams)
        self._seen: tuple[float, float] = (float("-inf"), float("-inf"))  # (mtime, when looked)
        self._book: OrderedDict[tuple[str, int | str], tuple[int, int | None]] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: Any) -> "Failover":
        """The gateway's :class:`door_config.GatewaySettings`: the active server first, the standby's, if any."""
        failover = cls([Upstream(settings.triton_http_port, settings.triton_grpc_port), *(
            [Upstream(settings.standby_http_port, settings.standby_grpc_port)] if settings.standby_http_port else [])],
            settings.servers_file, settings.host)
        failover.note_active()
        return failover

    # ------------------------------------------------------------------ routing
    def route(self, step: SequenceStep | None) -> tuple[list[int], Refusal | None]:
        """The upstreams to try, in order; or the refusal for a step of a sequence whose server died."""
        if step is not None and not step.start:
            known = self._book.get(step.key)
            if known is not None:
                slot, pid = known
                if not self._same_server(slot, pid):
                    self._book.pop(step.key, None)
                    return [], self.lost(step)
                self._book.move_to_end(step.key)
                return [slot], None  # the sequence's own server only: its state is there
        return self.order(), None

    def order(self) -> list[int]:
        return [self.active, *[i for i in range(len(self.upstreams)) if i != self.active]]

    def answered(self, slot: int, step: SequenceStep | None) -> None:
        """``slot`` answered: it is the active one now; a START is booked there, an END forgotten."""
        if slot != self.active and (step is None or step.start):  # a continued sequence is no failover
            self.active = slot
            self.note_active()
        if step is None:
            return
        if step.end:
            self._book.pop(step.key, None)
        elif step.start:
            self._book[step.key] = (slot, self._pid(slot))
            self._book.move_to_end(step.key)
            while len(self._book) > MAX_SEQUENCES:
                self._book.popitem(last=False)

    def down(self, slot: int) -> None:
        """``slot`` could not be reached (a stream's call): the other server is the active one from now on."""
        if slot == self.active and len(self.upstreams) > 1:
            self.active = self.order()[1]
            self.note_active()

    def unreachable(self, step: SequenceStep | None) -> Refusal | None:
        """The refusal when a sequence's own server could not be reached (it crashed meanwhile)."""
        if step is not None and not step.start and step.key in self._book:
            self._book.pop(step.key, None)
            return self.lost(step)
        return None

    @staticmethod
    def lost(step: SequenceStep) -> Refusal:
        return Refusal(400, LOST.format(cid=step.cid))

    # ------------------------------------------------------------------ which server is which
    def note_active(self) -> None:
        """Where the active server is, for whoever looks (tests, an operator): ``active.json`` by the servers'."""
        if self.servers_file is None:
            return
        up = self.upstreams[self.active]
        path = self.servers_file.with_name("active.json")
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps({"slot": self.active, "http_port": up.http_port, "grpc_port": up.grpc_port,
                                    "since": time.time()}))
        temp.replace(path)

    def _pid(self, slot: int) -> int | None:
        self._reload()
        return self._pids[slot]

    def channel(self, slot: int) -> Any:
        return grpc_channel(self.host, self.upstreams[slot].grpc_port)

    async def connected(self, channels: list[Any], slot: int) -> bool:
        return await connected(channels, slot, self)

    def running(self, slot: int) -> bool:
        """Whether ``slot``'s server runs, as far as ``serve``'s servers file tells (unknown: yes)."""
        pid = self._pid(slot)
        return pid is None or _alive(pid)

    def _same_server(self, slot: int, pid: int | None) -> bool:
        """Whether the server that ran the sequence's START still runs (its PID, alive and still ``slot``'s)."""
        if pid is None:
            return True  # PIDs unknown (no servers_file): nothing to tell, relay as before
        return self._pid(slot) == pid and _alive(pid)

    def _reload(self) -> None:
        now = time.monotonic()
        if self.servers_file is None or now - self._seen[1] < RELOAD_S:
            return
        try:
            mtime = self.servers_file.stat().st_mtime
            if mtime != self._seen[0]:
                entries = json.loads(self.servers_file.read_text())
                by_port = {e["http_port"]: e.get("pid") for e in entries}
                self._pids = [by_port.get(u.http_port) for u in self.upstreams]
            self._seen = (mtime, now)
        except (OSError, ValueError, KeyError, TypeError):
            self._seen = (self._seen[0], now)  # being rewritten: the PIDs known stay


async def send_http(session: aiohttp.ClientSession, failover: Failover, method: str, raw_path: str, slots: list[int],
                    step: SequenceStep | None, body: bytes, headers: dict[str, str]
                    ) -> aiohttp.ClientResponse | Refusal | None:
    """The answer of the first of ``slots``' tritonservers that takes the request; one that refuses the connection
    or closes it unanswered (it crashed) is passed over. Else the sequence's "lost" refusal, or ``None``: all down."""
    for slot in slots:
        up = failover.upstreams[slot]
        for _attempt in (1, 2):
            try:
                upstream = await session.request(method, f"http://{failover.host}:{up.http_port}{raw_path}",
                                                 data=body, headers=headers, allow_redirects=False)
                failover.answered(slot, step)
                return upstream
            except aiohttp.ClientConnectionError as exc:
                # Refused: nothing listens there, the next server. Closed unanswered (a kept-alive connection to
                # a server since restarted, or one that died answering): once more on a fresh connection.
                if isinstance(exc, aiohttp.ClientConnectorError) or not isinstance(exc, (
                        aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
                    break
    return failover.unreachable(step)


async def send_grpc(channels: list[Any], failover: Failover, method: str, slots: list[int], step: SequenceStep | None,
                    message: bytes, metadata: Any, timeout: float | None) -> bytes | Refusal | Any:
    """A unary call's answer from the first of ``slots``' servers that does not say UNAVAILABLE (a crashed server,
    or Triton's own: the next one is asked too); else the sequence's "lost" refusal, or the first error."""
    first = None
    for slot in slots:
        if not await connected(channels, slot, failover):
            continue
        call = channels[slot].unary_unary(method)(message, metadata=metadata, timeout=timeout)
        try:
            answer = await call
            failover.answered(slot, step)
            return answer
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                return exc
            first = first or exc
        finally:
            call.cancel()  # the client gave up (or it is done: then a no-op): so does the call to tritonserver
    return failover.unreachable(step) or first


def grpc_channel(host: str, port: int) -> Any:
    """A channel to one tritonserver: no size limits (the door's apply), reconnecting within a second of a restart
    (gRPC's default backoff grows to 120 s)."""
    return grpc.aio.insecure_channel(f"{host}:{port}", options=[
        ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000)])


async def connected(channels: list[Any], slot: int, failover: Failover) -> bool:
    """Whether ``slot``'s server can be reached (with one server: always tried, as before --standby).

    A channel to a server that crashed may stay not READY long after the server is back (seen here: 3 s
    and more), and a call on it fails at once with UNAVAILABLE. So a server that ``serve`` says runs (its
    PID, alive) gets :data:`CONNECT_S` to connect, then a new channel (one that is not READY carries no
    call) and as long again; a server known dead is passed over at once."""
    if len(channels) == 1 or channels[slot].get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
        return True
    if not failover.running(slot):
        return False
    for fresh in (False, True):
        if fresh:
            old, channels[slot] = channels[slot], grpc_channel(failover.host, failover.upstreams[slot].grpc_port)
            asyncio.ensure_future(old.close())
        try:
            await asyncio.wait_for(channels[slot].channel_ready(), CONNECT_S)
            return True
        except asyncio.TimeoutError:
            continue
    return False


def _alive(pid: int) -> bool:
    """A PID that runs: not gone, not a zombie (a crashed tritonserver stays one until serve reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def write_servers(path: Path, servers: list[tuple[int, int, int | None]]) -> None:
    """``serve``'s side: each server's HTTP port, gRPC port and PID, written atomically (read by :class:`Failover`)."""
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps([{"http_port": h, "grpc_port": g, "pid": p} for h, g, p in servers]))
    os.replace(temp, path)
