"""Exercise of notebook 11: make the learner's own request land in a batch of at least 8.

Registered through :mod:`lab_backends.lessons.exercises.end_to_end`. The checker serves
``digits_onnx`` on a traced server of its own (a broken config cannot hurt the learner's), starts
from the config with batching removed, applies the learner's override, checks that only the
batcher changed, sends the SEVEN drawing in a burst of :data:`BURST`, and reads the learner's
batch from the trace (shared compute stamps), not from any client-side guess.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.lessons.exercises.registry import exercise

MODEL = "digits_onnx"
BURST = 16
TARGET = 8


def _checked_config(live: Any, answer: Any) -> Any:
    from lab_backends.lessons.exercises.overrides import learner_batcher
    from lab_backends.server.config_changes import derive_config

    unbatched = derive_config(live, {"dynamic_batching": None})
    tuned = learner_batcher(
        unbatched, answer, "the config has no dynamic_batching: the default scheduler runs every request alone"
    )
    rest_before, rest_after = type(live)(), type(live)()
    rest_before.CopyFrom(unbatched)
    rest_after.CopyFrom(tuned)
    rest_after.ClearField("dynamic_batching")
    if rest_before != rest_after:
        raise ExerciseError(
            "change only dynamic_batching (instances, max_batch_size and the rest must stay as they are)"
        )
    return tuned


@exercise(
    "batch_of_eight",
    notebook="11_one_request_end_to_end",
    task=(
        f"Write a config override for {MODEL} (a dict such as {{'dynamic_batching': {{...}}}}, or a function that "
        f"edits the ModelConfig it gets) that changes ONLY the batcher so that, in a burst of {BURST} copies of your "
        f"drawing, YOUR request runs in a batch of at least {TARGET}. The checker starts from the config without "
        "batching, reloads the model on a traced server of its own, sends the burst, and reads your request's batch "
        "from the trace file."
    ),
    models=(),
)
def check_batch_of_eight(answer: Any, server: Any = None) -> str:
    from lab_backends.server.triton_server import TritonServer

    from .core import inspect
    from .pad import SEVEN, stroke

    if answer is None:
        raise NotImplementedError
    from lab_backends.paths import MODEL_REPOSITORY
    from lab_backends.server.repository import read_config

    _checked_config(read_config(MODEL_REPOSITORY / MODEL), answer)  # a wrong answer is told at once, no server
    with tempfile.TemporaryDirectory(prefix="exercise-batch-") as tmp:
        with TritonServer(
            models=[MODEL],
            trace_file=Path(tmp) / "trace.json",
            trace_level=("TIMESTAMPS",),
            trace_rate=1,
            trace_log_frequency=1,
            target="local",  # it reloads the model with your config and reads its own trace file
        ) as own:
            tuned = _checked_config(own.model_config(MODEL), answer)
            try:
                own.load_model(MODEL, config=tuned)
            except LabBackendsError as exc:
                raise ExerciseError(f"Triton refused your config: {str(exc)[:400]}") from exc
            inspect(own, MODEL, stroke(SEVEN), "gRPC", request_id="exercise-warmup")
            result = inspect(own, MODEL, stroke(SEVEN), "gRPC", burst=BURST)
    if result.batch_size < TARGET:
        raise ExerciseError(
            f"your request ran in a batch of {result.batch_size} (from the trace's shared compute "
            f"stamps); it must be at least {TARGET}: let the batcher wait longer for company"
        )
    return (
        f"your request ran in a batch of {result.batch_size} with {len(result.executions['shared_with'].iloc[0])} "
        f"other requests of the burst (from the trace file), with only the batcher changed."
    )
