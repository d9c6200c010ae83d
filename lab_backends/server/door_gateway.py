"""The front door's validating gateway: between nginx and tritonserver, it applies :mod:`door_rules`.

nginx keeps what it does well (HTTP/2 for gRPC clients, body limits, the admin key, the access log,
each learner's share: :mod:`door_config`) and hands this process every HTTP request with a body and
the two gRPC inference methods (``ModelInfer``, ``ModelStreamInfer``). It reads each request whole,
checks it against the served models' configs (:class:`ModelBook`, Triton's config protobuf read
with :func:`repository.read_config`) and passes it on unchanged, or answers the refusal: HTTP 400/413
with ``{"error": ...}`` as Triton answers errors, gRPC INVALID_ARGUMENT / RESOURCE_EXHAUSTED.

Why a Python process and not nginx's njs module (Debian ``libnginx-mod-http-js``): njs can read a
whole HTTP body and parse JSON, but it cannot serve gRPC. A gRPC message is protobuf inside HTTP/2
DATA frames; njs sees neither the frames of a bidirectional stream (``ModelStreamInfer`` answers
while the client still sends) nor any protobuf decoder, so the checks would have to be a hand-written
protobuf parser in JavaScript, and streams would pass unchecked. Here the ecosystem's own pieces do
each job: :mod:`json` (after :func:`door_rules.nesting_depth`, without recursion), tritonclient's
``service_pb2`` for the gRPC messages, ``grpc.aio`` relaying raw bytes both ways (no re-encoding),
and aiohttp (tritonclient's own HTTP dependency) for HTTP. The cost was measured: docs/scale.md.

Bounds on gRPC: each message at most ``message_limit`` bytes (the door's body limit, what nginx
enforces on unary calls), a stream at most ``stream_limit`` bytes in all (nginx cannot bound a
stream: it counts its messages as one body). A stream with a bad message is ended with the refusal.

Run by :mod:`front_door` as ``python -m lab_backends.server.door_gateway SETTINGS.json``: it listens on
free ports of 127.0.0.1 and, once both answer, writes them to the settings' ``ready_file`` (atomically);
SIGTERM stops it. When tritonserver is down (``serve --restart`` brings it back) it answers as nginx
does then: HTTP 503 / gRPC UNAVAILABLE with :data:`door_config.TRITON_DOWN`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import urllib.parse
import zlib
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from lab_backends.server.door_config import GatewaySettings
from lab_backends.server.door_rules import DOOR, ModelRules, Refusal, check_grpc, check_http, parse_json
from lab_backends.server.door_sequences import VERIFIED_HEADER, Owner, check_grpc_params, check_http_params, owner
from lab_backends.server.gateway_failover import Failover, grpc_step, http_step, send_grpc, send_http
from lab_backends.server.repository import model_dirs, read_config

GRPC_SERVICE = "/inference.GRPCInferenceService/"
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
#: Headers of one hop only (RFC 9110 7.6.1), and those the relay recomputes.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
              "host", "content-length"}
#: A request body goes on inflated (the gateway had to read it): its encoding goes too; nginx's word on the learner
#: is for the gateway alone (door_sequences).
REQUEST_DROPS = HOP_BY_HOP | {"content-encoding", VERIFIED_HEADER}
#: Until when a model missing from the book is looked for again (a repository may gain a folder).
RESCAN_S = 1.0


class ModelBook:
    """Each served model's :class:`ModelRules`, read from its ``config.pbtxt`` again when that changes.

    A model loaded with a config override (the load API) is checked against its file's config; a model
    not in any repository gets the checks that need no config (door_rules: elements against the data).
    """

    def __init__(self, repositories: tuple[str, ...]) -> None:
        self.repositories = [Path(r) for r in repositories]
        self._dirs: dict[str, Path] = {}
        self._scanned = float("-inf")
        self._rules: dict[str, tuple[float, ModelRules | None]] = {}

    def get(self, name: str) -> ModelRules | None:
        now = time.monotonic()
        if name not in self._dirs and now - self._scanned > RESCAN_S:
            self._dirs, self._scanned = model_dirs(r for r in self.repositories if r.is_dir()), now
        folder = self._dirs.get(name)
        if folder is None:
            return None
        try:
            mtime = (folder / "config.pbtxt").stat().st_mtime
        except OSError:
            return None
        cached = self._rules.get(name)
        if cached is None or cached[0] != mtime:
            try:
                rules = ModelRules.from_config(read_config(folder), name)
            except Exception:  # noqa: BLE001 - a config Triton cannot load either: Triton names its fault
                rules = None
            cached = self._rules[name] = (mtime, rules)
        return cached[1]


def _decompress(body: bytes, encoding: str, limit: int) -> tuple[bytes | None, Refusal | None]:
    """A gzip/deflate body (tritonclient's request compression) inflated, at most ``limit`` bytes."""
    wbits = {"gzip": 31, "deflate": 15}.get(encoding)
    if wbits is None:
        return None, Refusal(400, f"{DOOR} Content-Encoding {encoding[:20]!r}: send gzip, deflate or none")
    try:
        inflater = zlib.decompressobj(wbits)
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        return None, Refusal(400, f"{DOOR} a {encoding} body that does not inflate ({exc}): compress it whole")
    if len(plain) > limit or inflater.unconsumed_tail:
        return None, Refusal(413, f"{DOOR} a {encoding} body that inflates past {limit:,} bytes: send a smaller batch")
    return plain, None


def check_http_request(book: ModelBook, path: str, headers: dict[str, str], body: bytes,
                       who: Owner | None = None) -> Refusal | None:
    """The rules for one HTTP request (its path decoded): infer requests in full (``who``'s sequence IDs their
    own, door_sequences), other bodies' nesting."""
    found = INFER_PATH.match(path)
    if found:
        length = headers.get("inference-header-content-length")
        if length is not None and not length.strip().isdigit():
            return Refusal(400, f"{DOOR} Inference-Header-Content-Length {length[:20]!r}: give the JSON header's "
                                "length in bytes")
        name = found.group(1)
        return check_http(name, book.get(name), body, int(length) if length is not None else None,
                          lambda request: check_http_params(who, request))
    if body.strip():
        refusal = parse_json(body)[1]
        if refusal is not None and "nested" in refusal.message:
            return refusal  # malformed JSON elsewhere is Triton's to answer, as it does today
    return None


class HttpRelay:
    """aiohttp handlers: read, check, relay to tritonserver, stream its answer back."""

    def __init__(self, settings: GatewaySettings, book: ModelBook, failover: Failover) -> None:
        self.settings, self.book, self.failover = settings, book, failover
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        s = self.settings
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            body, refusal = _decompress(body, encoding, s.message_limit)
            if refusal:
                return _refuse(refusal)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROPS}
        refusal = check_http_request(self.book, urllib.parse.unquote(request.raw_path.split("?", 1)[0]),
                                     {k.lower(): v for k, v in headers.items()}, body,
                                     owner(request.headers.get(VERIFIED_HEADER)))
        if refusal:
            return _refuse(refusal)
        step = http_step(request.raw_path, headers, body)
        slots, refusal = self.failover.route(step)
        if refusal:
            return _refuse(refusal)
        assert self.session is not None
        upstream = await send_http(self.session, self.failover, request.method, request.raw_path, slots, step,
                                   body, headers)
        if not isinstance(upstream, aiohttp.ClientResponse):
            return _refuse(upstream) if upstream else web.json_response({"error": s.triton_down}, status=503)
        async with upstream:
            answer = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            if upstream.headers.get("Content-Length") is not None:
                answer.content_length = int(upstream.headers["Content-Length"])
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():  # generate_stream answers as it goes
                await answer.write(chunk)
            await answer.write_eof()
            return answer


def _refuse(refusal: Refusal) -> web.Response:
    return web.json_response({"error": refusal.message}, status=refusal.status)


class GrpcRelay(grpc.GenericRpcHandler):
    """``ModelInfer`` and ``ModelStreamInfer`` as raw bytes: parsed with ``service_pb2`` to check, relayed as sent."""

    def __init__(self, settings: GatewaySettings, book: ModelBook, failover: Failover) -> None:
        self.settings, self.book, self.failover = settings, book, failover
        self.channels = [failover.channel(slot) for slot in range(len(failover.upstreams))]

    def service(self, details: grpc.HandlerCallDetails):
        if details.method == GRPC_SERVICE + "ModelInfer":
            return grpc.unary_unary_rpc_method_handler(self.infer)
        if details.method == GRPC_SERVICE + "ModelStreamInfer":
            return grpc.stream_stream_rpc_method_handler(self.stream)
        if len(self.failover.upstreams) > 1:  # serve --standby: nginx sends every method here (door_upstreams)
            return grpc.unary_unary_rpc_method_handler(lambda message, context: self.other(details.method, message,
                                                                                           context))
        return None  # nginx sends no other method here

    async def other(self, method: str, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Any other method (metadata, statistics, model control), unchecked, to the active server."""
        answer = await send_grpc(self.channels, self.failover, method, self.failover.order(), None, message,
                                 _metadata(context), context.time_remaining())
        if isinstance(answer, grpc.aio.AioRpcError):
            await self._abort_as(context, answer)
        return answer

    def check(self, message: bytes, who: Owner | None = None) -> Refusal | None:
        limit = self.settings.message_limit
        if len(message) > limit:
            return Refusal(413, f"{DOOR} a gRPC message of {len(message):,} bytes (at most {limit:,}): send a "
                                "smaller batch")
        try:
            request = service_pb2.ModelInferRequest.FromString(message)
        except DecodeError as exc:
            return Refusal(400, f"{DOOR} a gRPC message that is not a ModelInferRequest ({exc}): send tritonclient's")
        return check_grpc(self.book.get(request.model_name), request) or check_grpc_params(who, request)

    async def infer(self, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        refusal = self.check(message, _verified(context))
        step = grpc_step(message)
        slots, lost = self.failover.route(step)
        refusal = refusal or lost
        if refusal:
            await context.abort(getattr(grpc.StatusCode, refusal.grpc_code), refusal.message)
        answer = await send_grpc(self.channels, self.failover, GRPC_SERVICE + "ModelInfer", slots, step, message,
                                 _metadata(context), context.time_remaining())
        if isinstance(answer, Refusal):
            await context.abort(getattr(grpc.StatusCode, answer.grpc_code), answer.message)
        if isinstance(answer, grpc.aio.AioRpcError):
            await self._abort_as(context, answer)
        return answer

    async def stream(self, messages, context: grpc.aio.ServicerContext):
        refused: list[Refusal] = []
        total, who = 0, _verified(context)

        async def checked():
            nonlocal total
            async for message in messages:
                total += len(message)
                refusal = self.check(message, who)
                if refusal is None and total > self.settings.stream_limit:
                    refusal = Refusal(413, f"{DOOR} a stream of more than {self.settings.stream_limit:,} bytes: "
                                           "open a new stream for further requests")
                step = grpc_step(message) if refusal is None else None
                refusal = refusal or self.failover.route(step)[1]
                if refusal:
                    refused.append(refusal)
                    call.cancel()
                    return
                yield message
                self.failover.answered(slot, step)  # a START is booked on this stream's server

        slot = self.failover.active  # a stream stays on one server: sequence steps that name another fail there
        await self.failover.connected(self.channels, slot)
        call = self.channels[slot].stream_stream(GRPC_SERVICE + "ModelStreamInfer")(
            checked(), metadata=_metadata(context), timeout=context.time_remaining())
        try:
            async for response in call:
                yield response
        except asyncio.CancelledError:
            if not refused:
                raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.failover.down(slot)  # the next stream (the client's retry) goes to the other server
            if not refused:
                await self._abort_as(context, exc)
        finally:
            call.cancel()  # the client left: tritonserver's side of the stream ends too
        if refused:
            await context.abort(getattr(grpc.StatusCode, refused[0].grpc_code), refused[0].message)

    async def _abort_as(self, context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError) -> None:
        """tritonserver's error, passed on; its absence (connection refused) in the door's words."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.settings.triton_down)
        await context.abort(exc.code(), exc.details() or "", exc.trailing_metadata() or ())


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    """The client's metadata (admin key, learner token, ...) minus what HTTP/2 and gRPC set per hop and nginx's
    word on the learner."""
    return tuple((k, v) for k, v in context.invocation_metadata() or ()
                 if not k.startswith((":", "grpc-")) and k not in {"content-type", "user-agent", "te", VERIFIED_HEADER})


def _verified(context: grpc.aio.ServicerContext) -> Owner | None:
    """The learner nginx verified (it sets the header itself, replacing any the client sent: door_share)."""
    return owner(next((v for k, v in context.invocation_metadata() or () if k == VERIFIED_HEADER), None))


async def serve(settings: GatewaySettings) -> None:
    """Both relays on the settings' ports (0: free ones) until SIGTERM; the ready file says where once both
    listen."""
    book = ModelBook(settings.repositories)
    failover = Failover.from_settings(settings)
    relay = HttpRelay(settings, book, failover)
    relay.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=3600), auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"))  # the client's own, or none
    app = web.Application(client_max_size=settings.message_limit + (1 << 16))
    app.router.add_route("*", "/{tail:.*}", relay.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, auto_decompress=False)  # ours is bounded
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.http_port, backlog=4096)
    await site.start()
    http_port = runner.addresses[0][1]
    grpc_relay = GrpcRelay(settings, book, failover)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", 2 * settings.message_limit),  # past the limit: door's words
        ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((grpc_relay,))
    grpc_port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    await server.start()
    ready = Path(settings.ready_file)
    temp = ready.with_suffix(".tmp")
    temp.write_text(json.dumps({"http_port": http_port, "grpc_port": grpc_port, "pid": os.getpid()}))
    temp.replace(ready)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await server.stop(1.0)
    await runner.cleanup()
    await relay.session.close()
    await asyncio.gather(*(channel.close() for channel in grpc_relay.channels))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lab_backends.server.door_gateway SETTINGS.json", file=sys.stderr)
        return 2
    asyncio.run(serve(GatewaySettings.read(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
