"""Plan a class: how many shared Triton replicas keep p99 latency under a bound, and what each
learner's pod needs. ``lab-backends plan-class --learners N --gpu-replicas R``.

Inputs are *measured*, not guessed: ``bench/scale/footprint.json`` (scripts/measure_footprint.py)
holds, for every notebook run top to bottom, the learner's memory and CPU and the request stream
the server received (requests and server time per model per 0.5 s interval).

The model (each assumption is printed with the plan):

* learner ``i`` starts at a uniform offset in ``[0, stagger_s]`` and runs the notebooks in order,
  each replayed at its recorded pace, with ``think_s`` between notebooks;
* a learner's requests go to one replica (gRPC and keep-alive HTTP connections stick to a pod);
  replicas are assigned round robin;
* each model has ``instances`` FIFO instances per replica; a request's service time is the mean
  server time per request measured here for that model, divided by ``speedup`` (1 = this CPU; a
  GPU is faster for the framework models, not for the Python glue). No dynamic batching is
  modelled, so batching models are planned pessimistically;
* requests of one interval arrive evenly spread over it (open loop: the class does not slow down
  when the server does, which is again pessimistic).
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lab_backends.errors import LabBackendsError
from lab_backends.paths import PROJECT_ROOT

FOOTPRINT = PROJECT_ROOT / "bench" / "scale" / "footprint.json"
INTERVAL_S = 0.5


def load_footprint(path: Path = FOOTPRINT) -> dict[str, dict[str, Any]]:
    if not path.exists():
        raise LabBackendsError(
            f"no measured footprint at {path}: run `PYTHONPATH=$PWD .venv/bin/python scripts/measure_footprint.py` "
            "first (it runs every notebook and records what it costs)"
        )
    return json.loads(path.read_text())


def service_times(footprint: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Mean seconds a model instance is busy per request (compute, a batch's time shared), per model.

    Not the server time per request: that includes the queueing the learner's own load caused.
    """
    n: dict[str, int] = defaultdict(int)
    ns: dict[str, int] = defaultdict(int)
    for nb in footprint.values():
        for _, model, count, _, busy_ns in nb.get("stream", []):
            n[model] += count
            ns[model] += busy_ns
    return {m: ns[m] / n[m] / 1e9 for m in n if n[m]}


def arrivals(footprint: Mapping[str, Mapping[str, Any]], learners: int, stagger_s: float, think_s: float,
             seed: int = 0) -> list[tuple[float, int, str]]:
    """(time s, learner, model) of every request the class sends, in time order."""
    rng = random.Random(seed)
    out: list[tuple[float, int, str]] = []
    order = sorted(footprint)
    for learner in range(learners):
        t0 = rng.uniform(0.0, stagger_s) if stagger_s > 0 else 0.0
        for name in order:
            nb = footprint[name]
            for t, model, count, *_ in nb.get("stream", []):
                for k in range(count):
                    out.append((t0 + t - INTERVAL_S + (k + 0.5) * INTERVAL_S / count, learner, model))
            t0 += float(nb.get("wall_s", 0.0)) + think_s
    out.sort()
    return out


@dataclass
class Outcome:
    replicas: int
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    busiest_model: str


def simulate(requests: list[tuple[float, int, str]], service_s: Mapping[str, float], replicas: int,
             instances: int = 1, speedup: float = 1.0) -> Outcome:
    """Latency of every request through FIFO model instances on ``replicas`` pods."""
    free: dict[tuple[int, str], list[float]] = {}
    latencies: list[float] = []
    waits: dict[str, float] = defaultdict(float)
    for t, learner, model in requests:
        key = (learner % replicas, model)
        heap = free.setdefault(key, [0.0] * instances)
        start = max(t, heapq.heappop(heap))
        done = start + service_s.get(model, 0.0) / speedup
        heapq.heappush(heap, done)
        latencies.append(done - t)
        waits[model] += start - t
    if not latencies:
        raise LabBackendsError("the footprint holds no requests: measure notebooks that send some")
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, math.ceil(q * len(latencies)) - 1)] * 1000

    return Outcome(replicas, len(latencies), round(pct(0.50), 2), round(pct(0.99), 2), round(latencies[-1] * 1000, 2),
                   max(waits, key=waits.get))


def learner_resources(footprint: Mapping[str, Mapping[str, Any]], headroom: float = 1.3) -> dict[str, Any]:
    """Per-learner pod requests/limits: the worst notebook's memory (kernel + embedded server) and CPU."""
    peak_mb = max(nb["peak_server_rss_mb"] + nb["peak_kernel_rss_mb"] for nb in footprint.values())
    cpu_rate = max((nb["server_cpu_s"] + nb["kernel_cpu_s"]) / max(nb["wall_s"], 1.0) for nb in footprint.values())
    return {
        "memory_request_mb": int(math.ceil(peak_mb * headroom / 64) * 64),
        "memory_limit_mb": int(math.ceil(peak_mb * headroom * 1.5 / 64) * 64),
        "cpu_request": round(max(0.25, min(cpu_rate, 2.0) / 2), 2),
        "cpu_limit": round(max(1.0, math.ceil(cpu_rate * 2) / 2), 1),
        "worst_notebook_peak_mb": round(peak_mb, 1),
    }


def plan(learners: int, gpu_replicas: int | None = None, p99_bound_ms: float = 250.0, stagger_s: float = 600.0,
         think_s: float = 120.0, speedup: float = 1.0, instances: int = 1, max_replicas: int = 64,
         footprint: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Simulate the class for ``gpu_replicas`` (or search the smallest count that meets the bound)."""
    footprint = footprint if footprint is not None else load_footprint()
    service = service_times(footprint)
    reqs = arrivals(footprint, learners, stagger_s, think_s)
    tried = []
    candidates = [gpu_replicas] if gpu_replicas else range(1, max_replicas + 1)
    for replicas in candidates:
        outcome = simulate(reqs, service, replicas, instances, speedup)
        tried.append(outcome)
        if gpu_replicas or outcome.p99_ms <= p99_bound_ms:
            break
    best = tried[-1]
    return {
        "learners": learners, "replicas": best.replicas, "meets_bound": best.p99_ms <= p99_bound_ms,
        "p99_bound_ms": p99_bound_ms, "outcomes": tried, "service_ms": {m: round(s * 1000, 2) for m, s in service.items()},
        "resources": learner_resources(footprint),
        "assumptions": {"stagger_s": stagger_s, "think_s": think_s, "speedup": speedup, "instances": instances,
                        "notebooks": sorted(footprint)},
    }


def report(result: Mapping[str, Any]) -> str:
    """The plan as text for the terminal and docs/scale.md."""
    lines = [f"class of {result['learners']} learners, p99 bound {result['p99_bound_ms']:g} ms"]
    for o in result["outcomes"]:
        lines.append(f"  {o.replicas:3d} replica(s): {o.requests} requests, p50 {o.p50_ms} ms, p99 {o.p99_ms} ms, "
                     f"max {o.max_ms} ms (most queueing: {o.busiest_model})")
    verdict = "meets" if result["meets_bound"] else "does NOT meet"
    lines.append(f"=> {result['replicas']} replica(s) {verdict} the bound")
    r = result["resources"]
    lines.append(f"per learner pod: memory {r['memory_request_mb']} MiB request / {r['memory_limit_mb']} MiB limit, "
                 f"cpu {r['cpu_request']} request / {r['cpu_limit']} limit (worst notebook {r['worst_notebook_peak_mb']} MB)")
    a = result["assumptions"]
    lines.append(f"assumptions: starts spread over {a['stagger_s']:g} s, {a['think_s']:g} s between notebooks, "
                 f"service time = measured here / {a['speedup']:g}, {a['instances']} instance(s) per model per replica, "
                 "sticky connections, no dynamic batching, open-loop arrivals")
    return "\n".join(lines)
