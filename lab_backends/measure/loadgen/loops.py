"""The two ways to offer load: a closed loop (N in flight) and an open loop (Poisson arrivals).

A record is (scheduled, start, end, error) in ``perf_counter`` seconds; error "" means success.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable

import numpy as np

# ----------------------------------------------------------------------------------- the loops
Record = tuple[float, float, float, str]
_CANCELLED = "no response before the window's end plus the request timeout (cancelled)"


async def closed_phase(sender: Any, concurrency: int, count: int, seconds: float) -> list[Record]:
    records: list[Record] = []
    clock = time.perf_counter
    deadline = clock() + seconds
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < count and clock() < deadline:
            issued += 1
            await _send_one(sender, records)

    await _bounded(sender, [worker() for _ in range(concurrency)], seconds)
    return records


async def open_phase(
    sender: Any, rate: float, count: int, seconds: float, rng: np.random.Generator, max_outstanding: int
) -> list[Record]:
    records: list[Record] = []
    clock = time.perf_counter
    tasks: set[asyncio.Task] = set()

    def one(scheduled: float) -> Awaitable[None]:
        return _send_one(sender, records, scheduled)

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


async def _send_one(sender: Any, records: list[Record], scheduled: float | None = None) -> None:
    """Send one request and record it; ``scheduled`` (open loop) is when it should have left."""
    clock = time.perf_counter
    start = clock()
    when = start if scheduled is None else scheduled
    try:
        error = await sender.send()
    except asyncio.CancelledError:
        records.append((when, start, clock(), _CANCELLED))
        raise
    records.append((when, start, clock(), error))


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
