"""Notebook 03's exercise: tune the dynamic batcher for throughput within a p99 bound."""

from __future__ import annotations

import contextlib
from typing import Any

from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.overrides import learner_batcher
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.measure.loadgen import run_closed
from lab_backends.server.config_changes import apply_config, derive_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

BATCHER_CONCURRENCY = 32
BATCHER_P99_MS = 100.0
BATCHER_SPEEDUP = 4.0


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
        "makes every request wait."
    ),
    models=("cost_model",),
)
def _check_tune_the_batcher(answer: Any, server: RunningServer | None) -> str:
    """Relative throughput (machine speed cancels out), absolute p99 (the learner's bound)."""
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
        load = dict(requests=400, duration_s=2.5, warmup_requests=2 * BATCHER_CONCURRENCY)
        apply_config(server, model, unbatched)
        before = run_closed(server, model, BATCHER_CONCURRENCY, **load).summary
        apply_config(server, model, tuned)  # raises ModelLoadError with Triton's reason if refused
        after = run_closed(server, model, BATCHER_CONCURRENCY, **load)
    got, speedup = after.summary, after.summary["throughput_rps"] / before["throughput_rps"]
    avg_batch = after.server.avg_batch if after.server is not None else float("nan")
    measured = (f"{got['throughput_rps']:.0f} req/s ({speedup:.1f}x the unbatched {before['throughput_rps']:.0f}), "
                f"p99 {got['p99_ms']:.1f} ms, average batch {avg_batch:.1f}")
    if got["errors"]:
        raise ExerciseError(f"{got['errors']} requests failed with your config, first: {got['first_error'][:200]}")
    missed = []  # every bound the config missed, not only the first
    if speedup < BATCHER_SPEEDUP:
        missed.append(f"the throughput must reach {BATCHER_SPEEDUP:g}x (it reached {speedup:.1f}x)")
    if got["p99_ms"] > BATCHER_P99_MS:
        missed.append(f"p99 must stay at or under {BATCHER_P99_MS:g} ms (it was {got['p99_ms']:.1f} ms): shorten "
                      "max_queue_delay or add a preferred batch size that the load can fill")
    if missed:
        raise ExerciseError(f"measured {measured}: " + "; and ".join(missed))
    return f"{measured}: fast and within the p99 bound."
