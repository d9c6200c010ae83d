"""Notebook 03's exercise: tune the dynamic batcher for throughput within a p99 bound."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.overrides import learner_batcher
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.measure.loadgen import run_closed
from lab_backends.notebook import measure_rounds, stretched
from lab_backends.server.config_changes import apply_config, derive_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

BATCHER_CONCURRENCY = 32
BATCHER_P99_MS = 100.0
BATCHER_SPEEDUP = 4.0


@dataclass(frozen=True)
class BatcherRun:
    """One measurement of both configs under the same closed-loop load, back to back."""

    before: dict[str, Any]  # the unbatched config's summary
    after: dict[str, Any]  # the tuned config's summary
    avg_batch: float

    @property
    def speedup(self) -> float:
        return self.after["throughput_rps"] / self.before["throughput_rps"]

    def misses(self) -> list[str]:
        """Every bound the tuned config missed in this run, not only the first."""
        missed = []
        if self.speedup < BATCHER_SPEEDUP:
            missed.append(f"the throughput must reach {BATCHER_SPEEDUP:g}x (it reached {self.speedup:.1f}x)")
        if self.after["p99_ms"] > BATCHER_P99_MS:
            missed.append(f"p99 must stay at or under {BATCHER_P99_MS:g} ms (it was {self.after['p99_ms']:.1f} ms): "
                          "shorten max_queue_delay or add a preferred batch size that the load can fill")
        return missed

    def describe(self) -> str:
        return (f"{self.after['throughput_rps']:.0f} req/s ({self.speedup:.1f}x the unbatched "
                f"{self.before['throughput_rps']:.0f}), p99 {self.after['p99_ms']:.1f} ms, average batch "
                f"{self.avg_batch:.1f}")


def _measure(server: RunningServer, model: str, unbatched: Any, tuned: Any, factor: float) -> BatcherRun:
    """Both configs, unbatched first, each loaded on the real server and measured over ``factor`` x the window."""
    load = stretched(dict(requests=400, duration_s=2.5), factor) | {"warmup_requests": 2 * BATCHER_CONCURRENCY}
    apply_config(server, model, unbatched)
    before = run_closed(server, model, BATCHER_CONCURRENCY, **load).summary
    apply_config(server, model, tuned)  # raises ModelLoadError with Triton's reason if refused
    after = run_closed(server, model, BATCHER_CONCURRENCY, **load)
    if after.summary["errors"]:
        raise ExerciseError(f"{after.summary['errors']} requests failed with your config, first: "
                            f"{after.summary['first_error'][:200]}")
    return BatcherRun(before, after.summary, after.server.avg_batch if after.server is not None else float("nan"))


@exercise(
    "tune_the_batcher",
    notebook="03_schedulers_and_dynamic_batching",
    task=(
        f"Write a config override for cost_model (a dict such as {{'dynamic_batching': {{...}}}}, or a function "
        f"that edits the ModelConfig it gets) that, with {BATCHER_CONCURRENCY} requests in flight and ONE model "
        f"instance, reaches at least {BATCHER_SPEEDUP:g}x the throughput of the same model without batching while "
        f"keeping p99 latency at or under {BATCHER_P99_MS:g} ms. The checker starts from cost_model's config with "
        "batching removed and one instance, applies your override, reloads the model on the real server, and "
        "measures both configs with the same closed-loop load. Beware: a long max_queue_delay batches more but "
        "makes every request wait. A miss is measured once more over a window twice as long, and that run "
        "decides: a busy machine can push p99 up, a wrong config misses both times."
    ),
    models=("cost_model",),
)
def _check_tune_the_batcher(answer: Any, server: RunningServer | None) -> str:
    """Relative throughput (machine speed cancels out), absolute p99 (the learner's bound).

    A miss is measured once more over a twice longer window (``notebook.measure_rounds``, the
    notebooks' timing claims' own retry) and the second run decides, with the same bounds: a p99
    bound is absolute, so a busy machine can push a correct config over it (a fresh clone's audit
    beside a one-core hog measured 224 ms for a 2 ms delay that measures ~30 ms when quiet).
    """
    if answer is None:
        raise NotImplementedError
    model = "cost_model"
    with contextlib.ExitStack() as stack:
        if server is None or server.options.trace_file is not None:
            # Tracing every request slows the batched side far more than the sleeping one.
            server = stack.enter_context(TritonServer(models=[model]))
        live = server.model_config(model)
        unbatched = derive_config(live, {"dynamic_batching": None,
                                         "instance_group": [{"kind": "KIND_CPU", "count": 1}]})
        tuned = learner_batcher(
            unbatched, answer, "the tuned config has no dynamic_batching: without it every execute() runs one request"
        )
        instances = sum(g.count or 1 for g in tuned.instance_group) or 1
        if instances != 1:
            raise ExerciseError(
                f"the tuned config runs {instances} instances; the task allows one: let the batcher do it"
            )
        stack.callback(server.load_model, model, live)  # give the learner's server back as it was

        def measure(factor: float) -> BatcherRun:
            return _measure(server, model, unbatched, tuned, factor)

        first = measure(1.0)
        if first.misses():
            print(f"… measured {first.describe()}: " + "; and ".join(first.misses()))
        rounds = measure_rounds(first, lambda run: bool(run.misses()), measure)
    last = rounds[-1]
    earlier = "".join(f" (after {run.describe()})" for run in rounds[:-1])
    if last.misses():
        raise ExerciseError(f"measured {last.describe()}{earlier}: " + "; and ".join(last.misses()))
    return f"{last.describe()}: fast and within the p99 bound."
