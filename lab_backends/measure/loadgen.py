"""A load generator that is not the bottleneck: closed and open loops over gRPC and HTTP.

Two ways to offer load, because they answer different questions:

* **closed loop** (:func:`run_closed`): N requests always in flight; a new one leaves only when one
  comes back. Throughput follows the server, and queueing stays hidden: when the server slows
  down, the client simply sends less.
* **open loop** (:func:`run_open`): requests arrive at a target rate (Poisson), whether or not the
  server keeps up. Latency is measured from each request's *scheduled* arrival, so when the server
  falls behind, the queue (and the latency) grows without bound, as it would with real users.

Each run has a warm-up, then a measured window bounded by a request count *and* a time limit. The
server's statistics are snapshotted right before and right after the window (with nothing in
flight), so the server-side breakdown (:mod:`lab_backends.measure.stats`) covers exactly the same requests.

Why it is fast enough: a plain ``tritonclient`` aio client spends most of its CPU building
``InferInput`` objects, serializing numpy arrays and wrapping results, per request, on the same two
cores the server needs. Here a request is serialized **once** (protobuf bytes for gRPC, a complete
HTTP/1.1 message with binary tensors for HTTP) and resent as-is: gRPC through a raw ``grpc.aio``
method with no (de)serializers, HTTP through a small keep-alive asyncio protocol. Responses
are checked for status, not decoded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from lab_backends.client.limits import check_inputs  # issue-20
from lab_backends.errors import LoadSettingError
from lab_backends.measure import stats as _stats

PROTOCOLS = ("grpc", "http")
#: ``grpc-tritonclient`` is the stock ``tritonclient.grpc.aio`` client, kept as a baseline to compare.
CLIENTS = ("grpc", "http", "grpc-tritonclient")
_GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
_PERCENTILES = (50, 90, 95, 99)

# ------------------------------------------------------------------------------------ requests


def example_inputs(config: Any, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """One valid request's inputs for a model config (random values, variable dims set to 1).

    Integer inputs draw from 0..16 so that the digits models' ``IMAGE`` (values 0..16) is valid.
    """
    from tritonclient.utils import triton_to_np_dtype
    from tritonclient.grpc import model_config_pb2

    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in config.input:
        dtype_name = model_config_pb2.DataType.Name(tensor.data_type).replace("TYPE_", "")
        if dtype_name == "STRING":
            dtype_name = "BYTES"
        dims = [d if d > 0 else 1 for d in tensor.dims]
        shape = ([batch] if config.max_batch_size > 0 else []) + dims
        if dtype_name == "BYTES":
            arrays[tensor.name] = np.full(shape, b"0", dtype=object)
            continue
        dtype = np.dtype(triton_to_np_dtype(dtype_name))
        if dtype.kind == "f":
            arrays[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arrays[tensor.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            arrays[tensor.name] = rng.integers(0, 17, shape).astype(dtype)
    return arrays


def _tensor_bytes(array: np.ndarray) -> tuple[str, bytes]:
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        serialized = serialize_byte_tensor(array)
        return "BYTES", (serialized.item() if serialized.size > 0 else b"")
    return np_to_triton_dtype(array.dtype), np.ascontiguousarray(array).tobytes()


def grpc_request_bytes(
    model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, version: str = ""
) -> bytes:
    """A serialized ``ModelInferRequest`` with raw tensor contents, built once and resent as-is."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in inputs.items():
        datatype, raw = _tensor_bytes(array)
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(np.shape(array))
        request.raw_input_contents.append(raw)
    for name in outputs or []:
        request.outputs.add(name=name)
    return request.SerializeToString()


def http_request_bytes(
    host: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None, version: str = ""
) -> bytes:
    """A complete HTTP/1.1 infer message: JSON header plus binary tensors (KServe binary extension)."""
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    blobs = []
    for name, array in inputs.items():
        datatype, raw = _tensor_bytes(array)
        header["inputs"].append(
            {"name": name, "shape": list(np.shape(array)), "datatype": datatype,
             "parameters": {"binary_data_size": len(raw)}}
        )
        blobs.append(raw)
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + b"".join(blobs)
    path = f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


# ------------------------------------------------------------------------------------- senders
# A sender turns "send one request" into an awaitable that returns "" on success or an error text.


class _GrpcSender:
    """One HTTP/2 channel, many concurrent calls of a bytes-in/bytes-out ``ModelInfer`` method."""

    def __init__(self, url: str, body: bytes, timeout_s: float) -> None:
        self.url, self.body, self.timeout_s = url, body, timeout_s

    async def open(self) -> None:
        import grpc

        self._grpc = grpc
        self.channel = grpc.aio.insecure_channel(
            self.url, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        )
        self.call = self.channel.unary_unary(_GRPC_INFER)  # no serializers: bytes go out as they are

    async def send(self) -> str:
        try:
            await self.call(self.body, timeout=self.timeout_s)
            return ""
        except self._grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

    async def close(self) -> None:
        await self.channel.close()


class _TritonclientGrpcSender:
    """The stock ``tritonclient.grpc.aio`` client, per-request objects and all (a baseline)."""

    def __init__(self, url: str, model: str, inputs: Mapping[str, np.ndarray], timeout_s: float) -> None:
        self.url, self.model, self.inputs, self.timeout_s = url, model, inputs, timeout_s

    async def open(self) -> None:
        import tritonclient.grpc.aio as aioclient

        self._module = aioclient
        self.client = aioclient.InferenceServerClient(self.url)

    async def send(self) -> str:
        from tritonclient.utils import InferenceServerException, np_to_triton_dtype

        tensors = []
        for name, array in self.inputs.items():
            datatype = "BYTES" if array.dtype.kind in "OSU" else np_to_triton_dtype(array.dtype)
            tensor = self._module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        try:
            result = await self.client.infer(self.model, tensors, client_timeout=self.timeout_s)
            for output in result.get_response().outputs:
                result.as_numpy(output.name)
            return ""
        except InferenceServerException as exc:
            return str(exc)

    async def close(self) -> None:
        await self.client.close()


class _HttpConnection(asyncio.Protocol):
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


class _HttpSender:
    """Keep-alive HTTP/1.1 connections, one per request in flight (HTTP/1.1 cannot multiplex)."""

    def __init__(self, url: str, message: bytes, timeout_s: float, max_connections: int) -> None:
        host, _, port = url.rpartition(":")
        self.host, self.port = host, int(port)
        self.message, self.timeout_s, self.max_connections = message, timeout_s, max_connections
        self.idle: list[_HttpConnection] = []
        self.opened = 0
        self.freed: asyncio.Event | None = None

    async def open(self) -> None:
        self.freed = asyncio.Event()

    async def _acquire(self) -> _HttpConnection:
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
                        _HttpConnection, self.host, self.port
                    )
                except BaseException:
                    self.opened -= 1
                    raise
                return connection
            self.freed.clear()
            await self.freed.wait()

    def _release(self, connection: _HttpConnection) -> None:
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


def _make_sender(
    server: Any, client: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
    timeout_s: float, max_connections: int,
):
    check_inputs(inputs)  # issue-20 hook: refuse overflowing/oversized shapes before any load
    if client == "grpc":
        return _GrpcSender(server.grpc_url, grpc_request_bytes(model, inputs, outputs), timeout_s)
    if client == "http":
        message = http_request_bytes(server.http_url, model, inputs, outputs)
        return _HttpSender(server.http_url, message, timeout_s, max_connections)
    if client == "grpc-tritonclient":
        return _TritonclientGrpcSender(server.grpc_url, model, inputs, timeout_s)
    raise LoadSettingError(f"protocol must be one of {', '.join(CLIENTS)}, not {client!r}")


# ----------------------------------------------------------------------------------- the loops
# A record is (scheduled, start, end, error) in perf_counter seconds; error "" means success.
Record = tuple[float, float, float, str]
_CANCELLED = "no response before the window's end plus the request timeout (cancelled)"


async def _closed_phase(sender: Any, concurrency: int, count: int, seconds: float) -> list[Record]:
    records: list[Record] = []
    clock = time.perf_counter
    deadline = clock() + seconds
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < count and clock() < deadline:
            issued += 1
            start = clock()
            try:
                error = await sender.send()
            except asyncio.CancelledError:
                records.append((start, start, clock(), _CANCELLED))
                raise
            records.append((start, start, clock(), error))

    await _bounded(sender, [worker() for _ in range(concurrency)], seconds)
    return records


async def _open_phase(
    sender: Any, rate: float, count: int, seconds: float, rng: np.random.Generator, max_outstanding: int
) -> list[Record]:
    records: list[Record] = []
    clock = time.perf_counter
    tasks: set[asyncio.Task] = set()

    async def one(scheduled: float) -> None:
        start = clock()
        try:
            error = await sender.send()
        except asyncio.CancelledError:
            records.append((scheduled, start, clock(), _CANCELLED))
            raise
        records.append((scheduled, start, clock(), error))

    async def arrivals() -> None:
        begin = clock()
        deadline = begin + seconds
        gaps = rng.exponential(1.0 / rate, size=count)
        scheduled = begin
        for gap in gaps:
            scheduled += gap
            if scheduled > deadline:
                break
            delay = scheduled - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= max_outstanding:  # the client's own limit: count it as a failure
                records.append((scheduled, clock(), clock(), f"dropped: more than {max_outstanding} outstanding"))
                continue
            task = asyncio.ensure_future(one(scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.wait(set(tasks))

    await _bounded(sender, [arrivals()], seconds)
    return records


async def _bounded(sender: Any, coroutines: list[Awaitable[None]], seconds: float) -> None:
    """Run the workers; past ``seconds`` + the request timeout, cancel whatever still waits."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    done, pending = await asyncio.wait(tasks, timeout=seconds + sender.timeout_s + 1.0)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in done:
        task.result()  # re-raise a bug in a worker instead of hiding it


# ------------------------------------------------------------------------------------- results


@dataclass
class LoadResult:
    """One measured window: per-request rows, a client summary, and the server's view."""

    requests: pd.DataFrame
    summary: dict[str, Any]
    server: _stats.ServerWindow | None = None
    metrics: dict[str, float] | None = None
    #: Prometheus pages taken right before and after the window (when asked for).
    metrics_text: tuple[str, str] | None = None
    #: Prometheus counters sampled every ``metrics_every_s`` during the window (when asked for):
    #: one row per sample, ``t_s`` plus one column per metric (see :func:`stats.metrics_timeline`).
    metrics_timeline: pd.DataFrame | None = None
    #: The raw statistics payloads taken right before and after the window (when asked for).
    stats_payloads: tuple[dict, dict] | None = None
    warmup: pd.DataFrame = field(default_factory=pd.DataFrame)

    def row(self) -> dict[str, Any]:
        """Summary plus server columns: one row of a tidy sweep frame."""
        row = dict(self.summary)
        if self.server is not None:
            row.update(self.server.as_row())
        return row


def _frame(records: list[Record], origin: float) -> pd.DataFrame:
    if not records:
        return pd.DataFrame(columns=["scheduled_s", "start_s", "end_s", "latency_ms", "ok", "error"])
    arr = np.array([r[:3] for r in records], dtype=float) - origin
    errors = [r[3] for r in records]
    frame = pd.DataFrame(
        {
            "scheduled_s": arr[:, 0],
            "start_s": arr[:, 1],
            "end_s": arr[:, 2],
            "latency_ms": (arr[:, 2] - arr[:, 0]) * 1000.0,
            "ok": [not e for e in errors],
            "error": errors,
        }
    )
    return frame.sort_values("scheduled_s", ignore_index=True)


def summarize(frame: pd.DataFrame, window_s: float) -> dict[str, Any]:
    """Throughput over the window and latency percentiles of the successful requests."""
    ok = frame[frame["ok"]] if len(frame) else frame
    latencies = ok["latency_ms"].to_numpy() if len(ok) else np.array([])
    summary: dict[str, Any] = {
        "requests": int(len(frame)),
        "ok": int(len(ok)),
        "errors": int(len(frame) - len(ok)),
        "window_s": float(window_s),
        "throughput_rps": float(len(ok) / window_s) if window_s > 0 else float("nan"),
        "mean_ms": float(latencies.mean()) if latencies.size else float("nan"),
    }
    for p in _PERCENTILES:
        summary[f"p{p}_ms"] = float(np.percentile(latencies, p)) if latencies.size else float("nan")
    errors = frame.loc[~frame["ok"], "error"] if len(frame) else []
    summary["first_error"] = str(errors.iloc[0]) if len(errors) else ""
    return summary


# ------------------------------------------------------------------------------------- running


def _run_async(factory: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine to completion from sync code, also inside Jupyter (whose loop is running).

    With a running loop in this thread (a notebook cell), the load runs on a fresh loop in a worker
    thread: blocking the cell is the point, and nesting loops would distort the timings.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lab-load") as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _check(name: str, value: float, minimum: float) -> None:
    if not value >= minimum:  # also catches NaN
        raise LoadSettingError(f"{name} must be >= {minimum}, not {value!r}")


async def _sample_metrics(
    server: Any, every_s: float | None, origin: float, stop: asyncio.Event, out: list[tuple[float, str]]
) -> None:
    """Scrape the Prometheus page every ``every_s`` until ``stop`` (in a thread: it blocks)."""
    if not every_s:
        return
    loop = asyncio.get_running_loop()
    while True:
        text = await loop.run_in_executor(None, _stats.scrape_metrics, server)
        out.append((time.perf_counter() - origin, text))
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


def _run(
    server: Any,
    model: str,
    phase: Callable[[Any, int, float], Awaitable[list[Record]]],
    *,
    protocol: str,
    inputs: Mapping[str, np.ndarray] | None,
    outputs: Sequence[str] | None,
    requests: int,
    duration_s: float,
    warmup_requests: int,
    warmup_s: float,
    server_stats: bool,
    metrics: bool,
    timeout_s: float,
    max_connections: int,
    summary_extra: dict[str, Any],
    metrics_every_s: float | None = None,
) -> LoadResult:
    _check("requests", requests, 1)
    _check("duration_s", duration_s, 0.001)
    _check("warmup_requests", warmup_requests, 0)
    _check("timeout_s", timeout_s, 0.001)
    if inputs is None:
        inputs = example_inputs(server.model_config(model))
    sender = _make_sender(server, protocol, model, inputs, outputs, timeout_s, max_connections)

    timeline: list[tuple[float, str]] = []

    def snapshot() -> tuple[dict | None, str | None]:
        payload = _stats.settled_statistics(server, model) if server_stats else None
        return payload, (_stats.scrape_metrics(server) if metrics else None)

    async def main() -> tuple[list[Record], list[Record], float, float, float, tuple, tuple]:
        loop = asyncio.get_running_loop()
        await sender.open()
        try:
            warm = await phase(sender, warmup_requests, warmup_s) if warmup_requests else []
            before = await loop.run_in_executor(None, snapshot)
            cpu0, origin = time.process_time(), time.perf_counter()
            stop = asyncio.Event()
            sampler = asyncio.ensure_future(_sample_metrics(server, metrics_every_s, origin, stop, timeline))
            try:
                measured = await phase(sender, requests, duration_s)
            finally:
                stop.set()
                await sampler
            finished, cpu1 = time.perf_counter(), time.process_time()
            after = await loop.run_in_executor(None, snapshot)
        finally:
            await sender.close()
        return warm, measured, origin, finished, cpu1 - cpu0, before, after

    warm, measured, origin, finished, cpu_s, before, after = _run_async(main)
    frame = _frame(measured, origin)
    window_s = (frame["end_s"].max() if len(frame) else finished - origin)
    summary = {"model": model, "protocol": protocol, **summary_extra, **summarize(frame, window_s)}
    summary["client_cpu_s"] = cpu_s
    summary["client_cpu_us_per_request"] = cpu_s / len(frame) * 1e6 if len(frame) else float("nan")
    result = LoadResult(requests=frame, summary=summary, warmup=_frame(warm, origin))
    if server_stats:
        result.server = _stats.window(before[0], after[0], model)
        result.stats_payloads = (before[0], after[0])
    if metrics:
        result.metrics_text = (before[1], after[1])
        result.metrics = _stats.metrics_delta(before[1], after[1], model)
    if timeline:
        result.metrics_timeline = _stats.metrics_timeline(timeline, model)
    return result


def run_closed(
    server: Any,
    model: str,
    concurrency: int = 1,
    *,
    protocol: str = "grpc",
    inputs: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[str] | None = None,
    requests: int = 500,
    duration_s: float = 10.0,
    warmup_requests: int | None = None,
    warmup_s: float = 2.0,
    server_stats: bool = True,
    metrics: bool = False,
    timeout_s: float = 30.0,
    metrics_every_s: float | None = None,
) -> LoadResult:
    """Keep ``concurrency`` requests in flight; measure ``requests`` of them or ``duration_s``, whichever ends first.

    ``inputs`` defaults to one random sample valid for the model's config. ``protocol`` is ``grpc``,
    ``http`` or ``grpc-tritonclient`` (the stock client, to compare). The result holds one row per
    measured request, a summary, and (``server_stats``) the server's statistics for the same window;
    ``metrics=True`` adds Prometheus counter deltas, ``metrics_every_s`` a timeline of them.
    """
    _check("concurrency", concurrency, 1)
    if warmup_requests is None:
        warmup_requests = max(4 * concurrency, 20)

    def phase(sender: Any, count: int, seconds: float) -> Awaitable[list[Record]]:
        return _closed_phase(sender, concurrency, count, seconds)

    return _run(
        server, model, phase, protocol=protocol, inputs=inputs, outputs=outputs, requests=requests,
        duration_s=duration_s, warmup_requests=warmup_requests, warmup_s=warmup_s, server_stats=server_stats,
        metrics=metrics, timeout_s=timeout_s, max_connections=concurrency,
        summary_extra={"mode": "closed", "concurrency": concurrency, "rate_rps": float("nan")},
        metrics_every_s=metrics_every_s,
    )


def run_open(
    server: Any,
    model: str,
    rate_rps: float,
    *,
    protocol: str = "grpc",
    inputs: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[str] | None = None,
    requests: int = 500,
    duration_s: float = 10.0,
    warmup_requests: int | None = None,
    warmup_s: float = 2.0,
    server_stats: bool = True,
    metrics: bool = False,
    timeout_s: float = 30.0,
    max_outstanding: int = 1024,
    seed: int = 0,
    metrics_every_s: float | None = None,
) -> LoadResult:
    """Poisson arrivals at ``rate_rps``; latency counts from each request's scheduled arrival.

    Offer more than the server can take and the latency keeps growing for as long as the window
    lasts: that is queueing, which a closed loop never shows. Requests beyond ``max_outstanding``
    in flight are recorded as failed ("dropped") rather than piling up in the client.
    """
    _check("rate_rps", rate_rps, 1e-6)
    _check("max_outstanding", max_outstanding, 1)
    rng = np.random.default_rng(seed)
    if warmup_requests is None:
        warmup_requests = max(int(rate_rps * 0.5), 10)

    def phase(sender: Any, count: int, seconds: float) -> Awaitable[list[Record]]:
        return _open_phase(sender, rate_rps, count, seconds, rng, max_outstanding)

    result = _run(
        server, model, phase, protocol=protocol, inputs=inputs, outputs=outputs, requests=requests,
        duration_s=duration_s, warmup_requests=warmup_requests, warmup_s=warmup_s, server_stats=server_stats,
        metrics=metrics, timeout_s=timeout_s, max_connections=max_outstanding,
        summary_extra={"mode": "open", "concurrency": float("nan"), "rate_rps": float(rate_rps)},
        metrics_every_s=metrics_every_s,
    )
    frame = result.requests
    if len(frame):
        # The offered rate over the window, and how far the client itself fell behind its schedule.
        result.summary["offered_rps"] = len(frame) / max(frame["scheduled_s"].max(), 1e-9)
        result.summary["max_send_lag_ms"] = float((frame["start_s"] - frame["scheduled_s"]).max() * 1000.0)
    return result
