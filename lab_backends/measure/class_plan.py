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
* each model has ``instances`` instances per replica, each running one execution at a time; an
  execution takes everything queued for the model when the instance is free, up to its
  ``max_batch_size`` (dynamic batching with no queue delay), and costs
  ``fixed + per_item x batch``, fitted to the batch statistics measured here, divided by
  ``speedup`` (1 = this CPU; a GPU is faster for the framework models, not for the Python glue);
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
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT, lesson_notebooks
from lab_backends.server.repository import model_dirs, read_config

FOOTPRINT = PROJECT_ROOT / "bench" / "scale" / "footprint.json"
INTERVAL_S = 0.5


def load_footprint(path: Path = FOOTPRINT) -> dict[str, dict[str, Any]]:
    if not path.exists():
        raise LabBackendsError(
            f"no measured footprint at {path}: run `PYTHONPATH=$PWD .venv/bin/python scripts/measure_footprint.py` "
            "first (it runs every notebook and records what it costs)"
        )
    return json.loads(path.read_text())


def notebook_code(path: Path) -> str:
    """A notebook's code cells, one after the other (markdown left out: prose may name any call)."""
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def local_notebooks() -> set[str]:
    """Notebooks that never use the shared server: they pin ``target="local"`` or fall back to it.

    Read from the notebooks themselves (``fallback_target(`` / ``target="local"`` in a code cell), so
    the plan follows the lessons as they are written.
    """
    return {path.stem for path in lesson_notebooks()
            if "fallback_target(" in (code := notebook_code(path)) or 'target="local"' in code}


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


def arrivals(
    footprint: Mapping[str, Mapping[str, Any]], learners: int, stagger_s: float, think_s: float, seed: int = 0
) -> list[tuple[float, int, str]]:
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


@dataclass(frozen=True)
class Cost:
    """One model's execution cost: ``fixed_s + per_item_s * batch``, batches up to ``max_batch``."""

    fixed_s: float
    per_item_s: float
    max_batch: int

    def seconds(self, batch: int) -> float:
        return self.fixed_s + self.per_item_s * batch


def execution_costs(footprint: Mapping[str, Mapping[str, Any]]) -> dict[str, Cost]:
    """Least-squares ``fixed + per_item x size`` per model from the measured batch statistics.

    A model only ever seen at batch size 1 gets ``per_item = 0`` and batches of 1; a model without
    batch statistics falls back to its mean busy time per request (:func:`service_times`).
    """
    points: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for nb in footprint.values():
        for model, sizes in nb.get("batches", {}).items():
            for size, (count, ns) in sizes.items():
                old = points[model].get(int(size), [0, 0])
                points[model][int(size)] = [old[0] + count, old[1] + ns]
    costs = {m: Cost(s, 0.0, 1) for m, s in service_times(footprint).items()}
    configured = _configured_max_batch()
    for model, sizes in points.items():
        data = [(size, ns / count / 1e9, count) for size, (count, ns) in sizes.items() if count > 0]
        if not data:
            continue
        weight = sum(w for *_, w in data)
        mean_x = sum(x * w for x, _, w in data) / weight
        mean_y = sum(y * w for _, y, w in data) / weight
        var = sum(w * (x - mean_x) ** 2 for x, _, w in data)
        slope = max(0.0, sum(w * (x - mean_x) * (y - mean_y) for x, y, w in data) / var) if var > 0 else 0.0
        fixed = max(0.0, mean_y - slope * mean_x)
        costs[model] = Cost(fixed, slope, max(max(x for x, *_ in data), configured.get(model, 1)))
    return costs


def _configured_max_batch() -> dict[str, int]:
    """``max_batch_size`` of the repository's models that batch dynamically (what the shared server runs)."""
    found = {}
    for name, folder in model_dirs([MODEL_REPOSITORY]).items():
        try:
            config = read_config(folder)
        except Exception:  # noqa: BLE001 - a broken config simply contributes nothing here
            continue
        if config.HasField("dynamic_batching") and config.max_batch_size > 0:
            found[name] = int(config.max_batch_size)
    return found


@dataclass
class Outcome:
    replicas: int
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    busiest_model: str


def simulate(
    requests: list[tuple[float, int, str]],
    costs: Mapping[str, Cost | float],
    replicas: int,
    instances: int = 1,
    speedup: float = 1.0,
) -> Outcome:
    """Latency of every request through batching model instances on ``replicas`` pods.

    ``costs`` may also map a model to plain seconds per request (no batching).
    """
    queues: dict[tuple[int, str], list[float]] = defaultdict(list)
    for t, learner, model in requests:
        queues[(learner % replicas, model)].append(t)
    latencies: list[float] = []
    waits: dict[str, float] = defaultdict(float)
    for (_, model), times in queues.items():
        cost = costs.get(model, 0.0)
        cost = cost if isinstance(cost, Cost) else Cost(float(cost), 0.0, 1)
        free = [0.0] * instances
        i = 0
        while i < len(times):
            start = max(times[i], heapq.heappop(free))
            j = i + 1
            while j < len(times) and times[j] <= start and j - i < cost.max_batch:
                j += 1
            done = start + cost.seconds(j - i) / speedup
            heapq.heappush(free, done)
            for k in range(i, j):
                latencies.append(done - times[k])
                waits[model] += start - times[k]
            i = j
    if not latencies:
        return Outcome(replicas, 0, 0.0, 0.0, 0.0, "-")
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, math.ceil(q * len(latencies)) - 1)] * 1000

    return Outcome(
        replicas,
        len(latencies),
        round(pct(0.50), 2),
        round(pct(0.99), 2),
        round(latencies[-1] * 1000, 2),
        max(waits, key=waits.get),
    )


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


def plan(
    learners: int,
    gpu_replicas: int | None = None,
    p99_bound_ms: float = 250.0,
    stagger_s: float = 600.0,
    think_s: float = 120.0,
    speedup: float = 1.0,
    instances: int = 1,
    max_replicas: int = 64,
    footprint: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Simulate the class for ``gpu_replicas`` (or search the smallest count that meets the bound)."""
    footprint = footprint if footprint is not None else load_footprint()
    costs = execution_costs(footprint)
    local = local_notebooks()
    # Local notebooks still take a learner's time (their wall time stays in the schedule) but send
    # nothing to the shared server.
    shared = {name: (nb if name not in local else {**nb, "stream": []}) for name, nb in footprint.items()}
    reqs = arrivals(shared, learners, stagger_s, think_s)
    tried = []
    candidates = [gpu_replicas] if gpu_replicas else range(1, max_replicas + 1)
    for replicas in candidates:
        outcome = simulate(reqs, costs, replicas, instances, speedup)
        tried.append(outcome)
        if gpu_replicas or outcome.p99_ms <= p99_bound_ms:
            break
    best = tried[-1]
    return {
        "learners": learners,
        "replicas": best.replicas,
        "meets_bound": best.p99_ms <= p99_bound_ms,
        "p99_bound_ms": p99_bound_ms,
        "outcomes": tried,
        "costs": costs,
        "resources": learner_resources(footprint),
        "assumptions": {
            "stagger_s": stagger_s,
            "think_s": think_s,
            "speedup": speedup,
            "instances": instances,
            "shared": sorted(set(footprint) - local),
            "local": sorted(set(footprint) & local),
        },
    }


def report(result: Mapping[str, Any]) -> str:
    """The plan as text for the terminal and docs/scale.md."""
    lines = [f"class of {result['learners']} learners, p99 bound {result['p99_bound_ms']:g} ms"]
    for o in result["outcomes"]:
        lines.append(
            f"  {o.replicas:3d} replica(s): {o.requests} requests, p50 {o.p50_ms} ms, p99 {o.p99_ms} ms, "
            f"max {o.max_ms} ms (most queueing: {o.busiest_model})"
        )
    verdict = "meets" if result["meets_bound"] else "does NOT meet"
    lines.append(f"=> {result['replicas']} replica(s) {verdict} the bound")
    lines.append(
        "execution cost per model (measured here): "
        + ", ".join(
            f"{m} {c.fixed_s * 1000:.1f}+{c.per_item_s * 1000:.2f}/item ms (batch<={c.max_batch})"
            for m, c in sorted(result["costs"].items())
        )
    )
    r = result["resources"]
    lines.append(
        f"per learner pod: memory {r['memory_request_mb']} MiB request / {r['memory_limit_mb']} MiB limit, "
        f"cpu {r['cpu_request']} request / {r['cpu_limit']} limit (worst notebook {r['worst_notebook_peak_mb']} MB)"
    )
    a = result["assumptions"]
    lines.append(
        f"on the shared server: {', '.join(a['shared'])}; on each learner's embedded server: "
        f"{', '.join(a['local']) or 'none'}"
    )
    lines.append(
        f"assumptions: starts spread over {a['stagger_s']:g} s, {a['think_s']:g} s between notebooks, "
        f"service time = measured here / {a['speedup']:g}, {a['instances']} instance(s) per model per replica, "
        "sticky connections, dynamic batching without queue delay, open-loop arrivals"
    )
    return "\n".join(lines)
