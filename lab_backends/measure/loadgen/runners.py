"""Running a load: the options both loops share, the window around the measured phase, the result.

The server's statistics are snapshotted right before and right after the measured window (with
nothing in flight), so the server-side breakdown covers exactly the requests the client measured.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from lab_backends.errors import LoadSettingError
from lab_backends.measure import stats as _stats
from lab_backends.measure.loadgen.loops import Record, closed_phase, open_phase
from lab_backends.measure.loadgen.payloads import example_inputs
from lab_backends.measure.loadgen.results import LoadResult, records_frame, summarize
from lab_backends.measure.loadgen.senders import make_sender
from lab_backends.server.running import RunningServer


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
    server: RunningServer, every_s: float | None, origin: float, stop: asyncio.Event, out: list[tuple[float, str]]
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


@dataclass(frozen=True)
class LoadOptions:
    """How a run offers load and what it records; the same for the closed and the open loop.

    ``inputs`` defaults to one random sample valid for the model's config. ``protocol`` is ``grpc``,
    ``http`` or ``grpc-tritonclient`` (the stock client, to compare). Each run measures ``requests``
    requests or ``duration_s`` seconds, whichever ends first, after a warm-up (``warmup_requests``,
    default: depends on the loop). ``server_stats`` takes the server's statistics for the same
    window; ``metrics=True`` adds Prometheus counter deltas, ``metrics_every_s`` a timeline of them.
    """

    protocol: str = "grpc"
    inputs: Mapping[str, np.ndarray] | None = None
    outputs: Sequence[str] | None = None
    requests: int = 500
    duration_s: float = 10.0
    warmup_requests: int | None = None
    warmup_s: float = 2.0
    server_stats: bool = True
    metrics: bool = False
    timeout_s: float = 30.0
    metrics_every_s: float | None = None

    @classmethod
    def of(cls, options: LoadOptions | None, overrides: dict[str, Any]) -> LoadOptions:
        """``options`` (or the defaults) with keyword ``overrides``; an unknown keyword says which are known."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise LoadSettingError(f"unknown load option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        chosen = replace(options or cls(), **overrides)
        _check("requests", chosen.requests, 1)
        _check("duration_s", chosen.duration_s, 0.001)
        _check("timeout_s", chosen.timeout_s, 0.001)
        if chosen.warmup_requests is not None:
            _check("warmup_requests", chosen.warmup_requests, 0)
        return chosen


@dataclass(frozen=True)
class Snapshot:
    """What the server said at one edge of the measured window (``None``: not asked for)."""

    statistics: dict | None
    metrics_text: str | None


@dataclass(frozen=True)
class Window:
    """One run's raw material: both phases' records, the clock, the client's CPU, the two snapshots."""

    warm: list[Record]
    measured: list[Record]
    origin: float
    finished: float
    cpu_s: float
    before: Snapshot
    after: Snapshot
    timeline: list[tuple[float, str]]


def _run(server: RunningServer, model: str, phase: Callable[[Any, int, float], Awaitable[list[Record]]],
         options: LoadOptions, warmup_requests: int, max_connections: int, summary_extra: dict[str, Any]) -> LoadResult:
    inputs = options.inputs if options.inputs is not None else example_inputs(server.model_config(model))
    sender = make_sender(server, options.protocol, model, inputs, options.outputs, options.timeout_s, max_connections)
    timeline: list[tuple[float, str]] = []

    def snapshot() -> Snapshot:
        return Snapshot(_stats.settled_statistics(server, model) if options.server_stats else None,
                        _stats.scrape_metrics(server) if options.metrics else None)

    async def main() -> Window:
        loop = asyncio.get_running_loop()
        await sender.open()
        try:
            warm = await phase(sender, warmup_requests, options.warmup_s) if warmup_requests else []
            before = await loop.run_in_executor(None, snapshot)
            cpu0, origin = time.process_time(), time.perf_counter()
            stop = asyncio.Event()
            sampler = asyncio.ensure_future(_sample_metrics(server, options.metrics_every_s, origin, stop, timeline))
            try:
                measured = await phase(sender, options.requests, options.duration_s)
            finally:
                stop.set()
                await sampler
            finished, cpu1 = time.perf_counter(), time.process_time()
            after = await loop.run_in_executor(None, snapshot)
        finally:
            await sender.close()
        return Window(warm, measured, origin, finished, cpu1 - cpu0, before, after, timeline)

    return _result(model, options, summary_extra, _run_async(main))


def _result(model: str, options: LoadOptions, summary_extra: dict[str, Any], run: Window) -> LoadResult:
    frame = records_frame(run.measured, run.origin)
    window_s = (frame["end_s"].max() if len(frame) else run.finished - run.origin)
    summary = {"model": model, "protocol": options.protocol, **summary_extra, **summarize(frame, window_s)}
    summary["client_cpu_s"] = run.cpu_s
    summary["client_cpu_us_per_request"] = run.cpu_s / len(frame) * 1e6 if len(frame) else float("nan")
    result = LoadResult(requests=frame, summary=summary, warmup=records_frame(run.warm, run.origin))
    if options.server_stats:
        result.server = _stats.window(run.before.statistics, run.after.statistics, model)
        result.stats_payloads = (run.before.statistics, run.after.statistics)
    if options.metrics:
        result.metrics_text = (run.before.metrics_text, run.after.metrics_text)
        result.metrics = _stats.metrics_delta(run.before.metrics_text, run.after.metrics_text, model)
    if run.timeline:
        result.metrics_timeline = _stats.metrics_timeline(run.timeline, model)
    return result


def run_closed(server: RunningServer, model: str, concurrency: int = 1, options: LoadOptions | None = None,
               **overrides: Any) -> LoadResult:
    """Keep ``concurrency`` requests in flight; measure ``requests`` of them or ``duration_s``, whichever ends first.

    ``options`` (a :class:`LoadOptions`) and/or its fields as keywords (``protocol="http"``,
    ``requests=200``...). The result holds one row per measured request, a summary, and the
    server's statistics for the same window.
    """
    _check("concurrency", concurrency, 1)
    chosen = LoadOptions.of(options, overrides)
    warmup = chosen.warmup_requests if chosen.warmup_requests is not None else max(4 * concurrency, 20)

    def phase(sender: Any, count: int, seconds: float) -> Awaitable[list[Record]]:
        return closed_phase(sender, concurrency, count, seconds)

    return _run(server, model, phase, chosen, warmup, concurrency,
                {"mode": "closed", "concurrency": concurrency, "rate_rps": float("nan")})


def run_open(server: RunningServer, model: str, rate_rps: float, options: LoadOptions | None = None, *,
             max_outstanding: int = 1024, seed: int = 0, **overrides: Any) -> LoadResult:
    """Poisson arrivals at ``rate_rps``; latency counts from each request's scheduled arrival.

    Offer more than the server can take and the latency keeps growing for as long as the window
    lasts: that is queueing, which a closed loop never shows. Requests beyond ``max_outstanding``
    in flight are recorded as failed ("dropped") rather than piling up in the client. ``options``
    and keywords as for :func:`run_closed`.
    """
    _check("rate_rps", rate_rps, 1e-6)
    _check("max_outstanding", max_outstanding, 1)
    chosen = LoadOptions.of(options, overrides)
    rng = np.random.default_rng(seed)
    warmup = chosen.warmup_requests if chosen.warmup_requests is not None else max(int(rate_rps * 0.5), 10)

    def phase(sender: Any, count: int, seconds: float) -> Awaitable[list[Record]]:
        return open_phase(sender, rate_rps, count, seconds, rng, max_outstanding)

    result = _run(server, model, phase, chosen, warmup, max_outstanding,
                  {"mode": "open", "concurrency": float("nan"), "rate_rps": float(rate_rps)})
    frame = result.requests
    if len(frame):
        # The offered rate over the window, and how far the client itself fell behind its schedule.
        result.summary["offered_rps"] = len(frame) / max(frame["scheduled_s"].max(), 1e-9)
        result.summary["max_send_lag_ms"] = float((frame["start_s"] - frame["scheduled_s"]).max() * 1000.0)
    return result
