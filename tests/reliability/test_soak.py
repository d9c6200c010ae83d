"""A bounded soak over gRPC and HTTP with mixed models: nothing lost, nothing mixed up, no growth.

Sized to fit the suite's 3-minute budget on a shared 2-core machine: 8,000 requests (plus a
400-request warm-up) at concurrency 32, about 12 s on a quiet machine and 25 s under load, in four
rounds so that the server's memory can be compared between rounds. ``LAB_FAST=1`` (or
``LAB_SOAK_REQUESTS``) shrinks it.
"""

from __future__ import annotations

import os

import psutil
import pytest

from lab_backends.server.processes import group_members
from lab_backends.waiting import poll

from .conftest import fast_cost_model
from .driver import LoadResult, Target, plan, run_load

pytestmark = [pytest.mark.server, pytest.mark.slow]

FAST = os.environ.get("LAB_FAST", "0") == "1"
TOTAL = int(os.environ.get("LAB_SOAK_REQUESTS", 2_000 if FAST else 8_000))
ROUNDS = 4
CONCURRENCY = 32
WARMUP = 400
MODELS = ("cost_model", "rel_double")
FACTORS = {"cost_model": 1.0, "rel_double": 2.0}  # echo vs double: a crossed answer is caught
#: Allowed RSS growth between the first and the last round: allocator noise, not a leak per request
#: (a leak of even 1 KiB per request would add ~15 MiB over the measured rounds).
RSS_SLACK_BYTES = 8 << 20
RSS_SLACK_RATIO = 0.10


def _counts(server, model: str) -> tuple[int, int, int]:
    stats = server.statistics(model)["model_stats"][0]
    inference = stats["inference_stats"]
    return int(stats["inference_count"]), int(inference["success"]["count"]), int(inference["fail"]["count"])


def _rss(server) -> tuple[int, int]:
    """(tritonserver RSS, RSS of all its stubs) in bytes."""
    main = psutil.Process(server.pid).memory_info().rss
    stubs = sum(psutil.Process(p).memory_info().rss for p in group_members(server.pid) if p != server.pid)
    return main, stubs


def test_soak_loses_nothing_and_agrees_with_the_statistics_api(rel_server):
    fast_cost_model(rel_server)
    target = Target(rel_server.grpc_url, rel_server.http_url, FACTORS)
    before = {m: _counts(rel_server, m) for m in MODELS}

    results: list[LoadResult] = [run_load(target, plan(WARMUP, MODELS), concurrency=CONCURRENCY)]
    rss = [_rss(rel_server)]
    per_round = TOTAL // ROUNDS
    next_id = WARMUP
    for _ in range(ROUNDS):
        results.append(
            run_load(target, plan(per_round, MODELS, first_id=next_id), concurrency=CONCURRENCY, deadline_s=120)
        )
        next_id += per_round
        rss.append(_rss(rel_server))

    sent = sum(r.sent for r in results)
    for r in results:
        assert (r.failed, r.mismatched, r.duplicated, r.lost) == (0, 0, 0, 0), r.summary()
        assert not r.stopped_early, r.summary()
    assert sent == WARMUP + ROUNDS * per_round == sum(r.ok for r in results)
    for protocol in ("grpc", "http"):
        assert sum(r.ok_by_protocol[protocol] for r in results) == sent // 2

    # The server's own books agree with the client's, request for request.
    # Triton counts a request as it releases it, a moment after the answer: wait for the last ones.
    ok = {m: sum(r.ok_by_model[m] for r in results) for m in MODELS}
    after = {m: poll(lambda m=m: _counts(rel_server, m), lambda c, m=m: c[0] - before[m][0] >= ok[m], 5.0, 0.02)
             for m in MODELS}
    for model in MODELS:
        client_ok = ok[model]
        inferences, successes, failures = (a - b for a, b in zip(after[model], before[model]))
        assert (inferences, successes, failures) == (client_ok, client_ok, 0), model

    # Memory: after the first round the server (and its stubs) must not keep growing.
    (server_first, stubs_first), (server_last, stubs_last) = rss[1], rss[-1]
    assert server_last - server_first <= RSS_SLACK_BYTES + RSS_SLACK_RATIO * server_first, rss
    assert stubs_last - stubs_first <= RSS_SLACK_BYTES + RSS_SLACK_RATIO * stubs_first, rss

    seconds = sum(r.seconds for r in results)
    print(
        f"\nsoak: {sent} requests (c={CONCURRENCY}, gRPC+HTTP, {', '.join(MODELS)}) in {seconds:.1f} s "
        f"= {sent / seconds:.0f} req/s; lost 0, duplicated 0, mismatched 0; server RSS "
        f"{rss[1][0] / 2**20:.1f} -> {rss[-1][0] / 2**20:.1f} MiB, stubs {rss[1][1] / 2**20:.1f} -> "
        f"{rss[-1][1] / 2**20:.1f} MiB"
    )
