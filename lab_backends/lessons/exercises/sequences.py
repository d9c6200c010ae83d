"""Notebook 08's exercise: drive interleaved sequences of a stateful model."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from lab_backends.client import sequences
from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.registry import answer_raised, exercise
from lab_backends.measure import stats as _stats
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer


@exercise(
    "interleaved_sequences",
    notebook="08_streaming_and_state",
    task=(
        "Write drive(server, sequences) for the stateful model running_mean. sequences maps a correlation ID "
        "(int) to a list of float values; the lists have different lengths. Advance the sequences in turn: in "
        "each round send the next value of every sequence that still has one (one request per value, VALUE "
        "of shape [1, 1], FP32), with sequence_start on a sequence's first request and sequence_end on its "
        "last. Return {correlation ID: the final MEAN the server answered}. Use lab_backends.client.infer.infer "
        "(its extra keyword arguments go to tritonclient: sequence_id=, sequence_start=, sequence_end=). "
        "The checker compares your means with its own, counts your requests in the statistics API, and "
        "checks that every sequence was ended."
    ),
    models=("running_mean",),
)
def _check_interleaved_sequences(answer: Callable[[Any, dict], dict], server: RunningServer | None) -> str:
    """Random IDs and values each time, so a hard-coded answer cannot pass."""
    rng = np.random.default_rng()
    corrids = [int(c) for c in rng.choice(np.arange(10_000, 1_000_000), size=3, replace=False)]
    task = {c: [float(v) for v in rng.integers(-50, 50, size=n)] for c, n in zip(corrids, (4, 6, 3))}
    with contextlib.ExitStack() as stack:
        if server is None or not server.model_ready(sequences.MODEL):
            server = stack.enter_context(TritonServer(models=[sequences.MODEL], target="local"))
        before = _stats.settled_statistics(server, sequences.MODEL)
        try:
            got = answer(server, {c: list(v) for c, v in task.items()})
        except (NotImplementedError, ExerciseError):
            raise
        except Exception as exc:
            raise answer_raised("drive(server, sequences)", exc, server) from exc
        after = _stats.settled_statistics(server, sequences.MODEL)
        if not isinstance(got, dict):
            raise ExerciseError(f"drive must return a dict {{correlation ID: final mean}}, not {type(got).__name__}")
        if set(got) != set(task):
            raise ExerciseError(f"you returned means for IDs {sorted(got)}, expected {sorted(task)}")
        for corrid, values in task.items():
            want = float(np.mean(values))
            if not np.isclose(float(got[corrid]), want, rtol=1e-5, atol=1e-5):
                raise ExerciseError(
                    f"sequence {corrid} (values {values}) ended with mean {float(got[corrid]):.4f}, expected "
                    f"{want:.4f}: was every value sent once, with START only on the first request of the sequence?"
                )
        sent, total = _stats.window(before, after, sequences.MODEL).requests, sum(len(v) for v in task.values())
        if sent != total:
            raise ExerciseError(f"running_mean received {sent} requests, expected {total}: one request per value")
        still_open = [c for c in task if sequences.is_live(server, c)]
        if still_open:
            raise ExerciseError(
                f"sequences {still_open} were still open after drive returned: send sequence_end=True with the "
                "last value, or the sequence holds a slot until max_sequence_idle_microseconds passes"
            )
    return (
        f"three interleaved sequences ({', '.join(str(len(v)) for v in task.values())} values) kept their own "
        f"means in {total} requests, and every one was ended."
    )
