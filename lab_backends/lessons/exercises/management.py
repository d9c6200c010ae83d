"""Notebook 07's exercise: serve a canary (versions 1 and 3) with one load call."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lab_backends.client.infer import infer
from lab_backends.errors import ExerciseError
from lab_backends.lessons import authoring, management
from lab_backends.lessons.exercises.registry import answer_raised, exercise
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

CANARY_MODEL = "canary"


@exercise(
    "canary_versions",
    notebook="07_model_management",
    task=(
        "Write canary(server, name) for a model with versions 1, 2 and 3 on disk, whose config.pbtxt serves "
        "only the latest (3). With ONE load call and a config override, make the server serve versions 1 and "
        "3 side by side (not 2) with max_batch_size lowered to 4, everything else as it is now. Do not touch "
        "any file. The checker calls canary on a fresh server, then proves it through the API: the repository "
        "index, a request to each version, a batch of 5 refused and 4 accepted, and the served config."
    ),
    models=(),
)
def _check_canary_versions(answer: Callable[[Any, str], Any], server: RunningServer | None) -> str:
    with tempfile.TemporaryDirectory(prefix="exercise-canary-") as tmp:
        model_dir = authoring.write_model(
            tmp, management.VERSIONED_SOURCE, management.versioned_config(CANARY_MODEL), versions=(1, 2, 3)
        )

        def files() -> dict[Path, bytes]:  # __pycache__ is the stub's own doing, not the learner's
            return {p.relative_to(model_dir): p.read_bytes() for p in sorted(model_dir.rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts}

        before = files()
        with TritonServer(model_repository=[tmp], models=[CANARY_MODEL], target="local") as own:
            original = own.model_config(CANARY_MODEL)
            try:
                answer(own, CANARY_MODEL)
            except (NotImplementedError, ExerciseError):
                raise
            except Exception as exc:
                raise answer_raised("canary(server, name)", exc, own) from exc
            if files() != before:
                raise ExerciseError(
                    "files in the model folder changed: do it with a config override on load, not on disk"
                )
            states = management.version_states(own, CANARY_MODEL)
            if management.ready_versions(own, CANARY_MODEL) != [1, 3]:
                raise ExerciseError(
                    f"the repository index says {states}; expected versions 1 and 3 READY and 2 not. "
                    "A version_policy with specific versions does that"
                )
            config = own.model_config(CANARY_MODEL)
            lost = [f for f in ("input", "output", "parameters", "instance_group")
                    if list(getattr(config, f)) != list(getattr(original, f))]
            if lost:
                raise ExerciseError(
                    f"your override changed {', '.join(lost)}: Triton replaces the whole config with the one sent "
                    "on load, so start from server.model_config(name) and change only what the task asks"
                )
            if config.max_batch_size != 4:
                raise ExerciseError(f"the served config has max_batch_size {config.max_batch_size}, expected 4")
            served = {v: management.infer_version(own, CANARY_MODEL, v) for v in (1, 3)}
            if served != {1: 1, 3: 3}:
                raise ExerciseError(f"asking each version answered {served}")
            x4, x5 = np.zeros((4, 1), np.float32), np.zeros((5, 1), np.float32)
            infer(own, CANARY_MODEL, {"X": x4}, model_version="3")
            try:
                infer(own, CANARY_MODEL, {"X": x5}, model_version="3")
            except Exception as exc:  # noqa: BLE001 - the refusal is what we want
                refusal = str(exc)
            else:
                raise ExerciseError("a batch of 5 was accepted: max_batch_size 4 is not in force")
    return (
        f"versions {sorted(served)} answer side by side, 2 is not served ({states.get(2, 'not loaded')}), "
        f"and the server refuses a batch of 5: {refusal.splitlines()[0][:90]}"
    )
