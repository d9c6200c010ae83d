"""The response cache and the rate limiter, shown on a real server (notebook 10).

Two server features that change *whether* and *when* a model runs, and what you can see of it:

* **response cache** (``--cache-config local,size=N`` plus ``response_cache { enable: true }`` in a
  model's config): Triton hashes a request's inputs; a repeat is answered from memory without
  queueing for or running the model. The statistics API counts ``cache_hit`` / ``cache_miss``, and
  ``inference_count`` grows only for the misses;
* **rate limiter** (``--rate-limit=execution_count --rate-limit-resource=R:N`` plus
  ``rate_limiter { resources [...] }`` on an instance group): an instance may execute only while
  it holds its resources; with fewer resources than instances, instances take turns even though
  they are idle, and requests wait in the queue instead;

The third feature of notebook 10, summary latencies, is parsing of the metrics page:
:func:`lab_backends.measure.prometheus.summary_table`.

The configs are derived from the one the server uses now (see :mod:`lab_backends.server.config_changes`),
because an override on load replaces the whole config.
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from lab_backends.client.infer import infer
from lab_backends.errors import LoadSettingError
from lab_backends.measure import stats as _stats
from lab_backends.server.config_changes import apply_config
from lab_backends.server.running import RunningServer
from lab_backends.waiting import settled

# ---------------------------------------------------------------------------------------- cache


def enable_cache(server: RunningServer, model: str) -> Any:
    """Reload ``model`` with ``response_cache { enable: true }``; returns the config sent.

    The server must have been started with a cache (``TritonServer(cache_size=...)``): otherwise
    Triton refuses the load, which is the clearest error there is.
    """
    return apply_config(server, model, lambda config: setattr(config.response_cache, "enable", True))


@dataclass(frozen=True)
class CacheCounts:
    """Cumulative cache counters of one model (statistics API), with inferences and executions.

    ``hit_ns`` / ``miss_ns`` are the total time Triton spent on cache lookups that hit / missed
    (a miss also pays for inserting the new response).
    """

    hits: int
    misses: int
    hit_ns: int
    miss_ns: int
    inferences: int
    executions: int

    @property
    def hit_ms(self) -> float:
        return self.hit_ns / self.hits / 1e6 if self.hits else float("nan")

    @property
    def miss_ms(self) -> float:
        return self.miss_ns / self.misses / 1e6 if self.misses else float("nan")

    def __sub__(self, other: "CacheCounts") -> "CacheCounts":
        return CacheCounts(*(a - b for a, b in zip(astuple(self), astuple(other))))


def cache_counts(server: RunningServer, model: str) -> CacheCounts:
    """``cache_hit`` / ``cache_miss`` counts (and their average lookup time) from the statistics API."""
    entries = _stats.model_entries(_stats.fetch_statistics(server, model), model)
    hits = misses = inferences = executions = 0
    hit_ns = miss_ns = 0
    for entry in entries:
        inference = entry.get("inference_stats", {})
        hits += int(inference.get("cache_hit", {}).get("count", 0) or 0)
        hit_ns += int(inference.get("cache_hit", {}).get("ns", 0) or 0)
        misses += int(inference.get("cache_miss", {}).get("count", 0) or 0)
        miss_ns += int(inference.get("cache_miss", {}).get("ns", 0) or 0)
        inferences += int(entry.get("inference_count", 0) or 0)
        executions += int(entry.get("execution_count", 0) or 0)
    return CacheCounts(hits, misses, hit_ns, miss_ns, inferences, executions)


@dataclass
class CacheRun:
    """One cache experiment: per-request rows (``kind`` is ``repeat`` or ``new``) and the counter deltas."""

    requests: pd.DataFrame
    counts: CacheCounts

    def median_ms(self, kind: str) -> float:
        return float(self.requests.loc[self.requests["kind"] == kind, "latency_ms"].median())


def _settled_counts(server: RunningServer, model: str, attempts: int = 400) -> CacheCounts:
    """Counters once they stop moving: Triton updates them as it releases a request, a moment late."""
    return settled(lambda: cache_counts(server, model), interval_s=0.01, attempts=attempts)


def cache_experiment(
    server: RunningServer, model: str, inputs: Mapping[str, np.ndarray], rounds: int = 20, seed: int = 0,
    protocol: str = "grpc",
) -> CacheRun:
    """Alternate a repeated request with new ones, one at a time; time each and count hits.

    ``inputs`` is the request that gets repeated (sent once first, so that its response is in the
    cache); each round then sends it again (a ``repeat``: a hit) and one request with fresh random
    values of the same shapes (``new``: a miss). Alternating keeps both kinds under the same
    background load, so their latencies compare fairly.
    """
    if rounds < 1:
        raise LoadSettingError(f"rounds must be >= 1, not {rounds!r}")
    rng = np.random.default_rng(seed)
    infer(server, model, inputs, protocol=protocol)  # put the repeated request in the cache
    before = _settled_counts(server, model)
    rows = []
    for i in range(rounds):
        fresh = {name: rng.standard_normal(np.shape(a)).astype(np.asarray(a).dtype) for name, a in inputs.items()}
        for kind, request in (("repeat", inputs), ("new", fresh)):
            start = time.perf_counter()
            outputs = infer(server, model, request, protocol=protocol)
            rows.append({"round": i, "kind": kind, "latency_ms": (time.perf_counter() - start) * 1000.0,
                         "outputs": outputs})
    after = _settled_counts(server, model)
    return CacheRun(pd.DataFrame(rows), after - before)


# ---------------------------------------------------------------------------------- rate limiter


def rate_limited(
    server: RunningServer,
    model: str,
    instances: int,
    resources: Mapping[str, int] | None = None,
    batching: bool = False,
) -> Any:
    """Reload ``model`` with ``instances`` instances, each needing ``resources`` to execute.

    ``resources=None`` leaves the instances unlimited (the baseline). ``batching=False`` removes the
    dynamic batcher so that one request is one execution, and the limiter's effect is easy to read.
    """
    if instances < 1:
        raise LoadSettingError(f"instances must be >= 1, not {instances!r}")

    def edit(config: Any) -> None:
        if not config.instance_group:
            config.instance_group.add()
        del config.instance_group[1:]
        group = config.instance_group[0]
        group.count = instances
        group.ClearField("rate_limiter")
        config.ClearField("response_cache")  # every request must run the model to show the limiter
        for name, count in (resources or {}).items():
            group.rate_limiter.resources.add(name=name, count=int(count))
        if not batching:
            config.ClearField("dynamic_batching")

    return apply_config(server, model, edit)


def server_resources(server: RunningServer) -> dict[str, int]:
    """The rate-limiter resources the server was started with (``rate_limit_resources``)."""
    return dict(getattr(server.options, "rate_limit_resources", None) or {})
