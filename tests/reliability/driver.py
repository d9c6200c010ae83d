"""A minimal, bounded load driver for the reliability suite (gRPC and HTTP, asyncio).

Why its own driver: the suite must account for *every* request: each one carries an id and a
payload whose answer is known, so a lost, duplicated or mismatched response is counted, not
guessed. It is bounded three ways (request count, concurrency, wall-clock deadline) and it never
leaves threads behind: :func:`run_load` runs the event loop in one thread that it joins.

Payload of request ``i``: ``arange(16) + 16 * i`` (exact in float32 for i < 2**19); the answer is
``factor * payload`` where the factor is per model (1 for an echo, 2 for ``rel_double``).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

MAX_ID = 1 << 19


def payload(request_id: int) -> np.ndarray:
    """The known input of request ``request_id`` (batch of one)."""
    if not 0 <= request_id < MAX_ID:
        raise ValueError(f"request ids must lie in [0, {MAX_ID}) to stay exact in float32")
    return (np.arange(16, dtype=np.float32) + np.float32(16 * request_id)).reshape(1, 16)


@dataclass(frozen=True)
class Target:
    """Where to send: endpoints and the echo factor of each model."""

    grpc_url: str
    http_url: str
    factors: Mapping[str, float]


@dataclass
class LoadResult:
    """Every request ends in exactly one bucket: ok, failed, mismatched or lost."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    mismatched: int = 0
    duplicated: int = 0
    lost: int = 0
    seconds: float = 0.0
    ok_by_model: Counter = field(default_factory=Counter)
    ok_by_protocol: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    stopped_early: bool = False

    @property
    def accounted(self) -> int:
        return self.ok + self.failed + self.mismatched + self.lost

    def summary(self) -> str:
        top = "; ".join(f"{n}x {e}" for e, n in self.errors.most_common(3))
        return (
            f"sent={self.sent} ok={self.ok} failed={self.failed} mismatched={self.mismatched} "
            f"duplicated={self.duplicated} lost={self.lost} in {self.seconds:.1f} s"
            + (f" (errors: {top})" if top else "")
        )


def plan(count: int, models: Sequence[str], protocols: Sequence[str] = ("grpc", "http"), first_id: int = 0):
    """``count`` requests (id, protocol, model), mixing models and protocols round-robin."""
    return [
        (first_id + i, protocols[i % len(protocols)], models[(i // len(protocols)) % len(models)])
        for i in range(count)
    ]


async def _drive(target: Target, requests, concurrency: int, deadline_s: float, timeout_s: float,
                 stop_after_failures: int | None) -> LoadResult:
    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http.aio as httpaio

    result = LoadResult()
    seen: set[int] = set()
    queue = iter(requests)
    start = time.monotonic()
    grpc_client = grpcaio.InferenceServerClient(target.grpc_url)
    http_client = httpaio.InferenceServerClient(target.http_url, conn_limit=concurrency, conn_timeout=timeout_s)

    async def one(request_id: int, protocol: str, model: str) -> None:
        module = grpcaio if protocol == "grpc" else httpaio
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        sent = payload(request_id)
        tensor.set_data_from_numpy(sent)
        client = grpc_client if protocol == "grpc" else http_client
        try:
            response = await asyncio.wait_for(
                client.infer(model, [tensor], request_id=str(request_id)), timeout=timeout_s
            )
        except asyncio.TimeoutError:
            result.lost += 1
            return
        except Exception as exc:  # noqa: BLE001 - every failure is counted by kind
            result.failed += 1
            result.errors[str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__] += 1
            return
        raw = response.get_response(as_json=True) if protocol == "grpc" else response.get_response()
        answered = int(raw.get("id", -1))
        if answered in seen:
            result.duplicated += 1
        seen.add(answered)
        out = response.as_numpy("OUTPUT0")
        if answered != request_id or out is None or not np.array_equal(out, sent * np.float32(target.factors[model])):
            result.mismatched += 1
            return
        result.ok += 1
        result.ok_by_model[model] += 1
        result.ok_by_protocol[protocol] += 1

    async def worker() -> None:
        for request_id, protocol, model in queue:
            if time.monotonic() - start > deadline_s or (
                stop_after_failures is not None and result.failed + result.lost >= stop_after_failures
            ):
                result.stopped_early = True
                return
            result.sent += 1
            await one(request_id, protocol, model)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await grpc_client.close()
        await http_client.close()
    result.seconds = time.monotonic() - start
    return result


def run_load(
    target: Target,
    requests,
    concurrency: int = 32,
    deadline_s: float = 60.0,
    timeout_s: float = 30.0,
    stop_after_failures: int | None = None,
) -> LoadResult:
    """Run the requests with ``concurrency`` in flight; return when all are accounted for.

    Raises ``RuntimeError`` if the driver thread itself does not finish within the deadline plus
    a margin: that is the "hung thread" the fault tests look for.
    """
    box: dict[str, object] = {}

    def main() -> None:
        try:
            box["result"] = asyncio.run(
                _drive(target, requests, concurrency, deadline_s, timeout_s, stop_after_failures)
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=main, name="reliability-load", daemon=True)
    thread.start()
    thread.join(deadline_s + timeout_s + 30)
    if thread.is_alive():
        raise RuntimeError(f"load driver still running {deadline_s + timeout_s + 30:.0f} s after start: hung")
    # Failed gRPC calls sit in reference cycles (exception -> frame -> call); until they are
    # collected, grpc.aio keeps its process-wide poller thread alive. Collect them now, so that
    # "no thread left behind" holds right after a run that saw failures (measured).
    gc.collect()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
