"""The learner's batcher override, applied the way every batching exercise checks it.

Two exercises (03's ``tune_the_batcher`` and 11's ``batch_of_eight``) take a config override from
the learner; both must derive it onto a known base the same way and refuse, in the same words, an
override that does not apply or that leaves the batcher off.
"""

from __future__ import annotations

from typing import Any

from lab_backends.errors import ExerciseError
from lab_backends.server.config_changes import derive_config
from lab_backends.server.repository import ModelConfig


def learner_batcher(base: ModelConfig, answer: Any, without_batcher: str) -> ModelConfig:
    """``base`` with the learner's override; ``without_batcher`` says why no dynamic_batching fails."""
    try:
        tuned = derive_config(base, answer)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise ExerciseError(f"your override could not be applied: {type(exc).__name__}: {exc}") from exc
    if not tuned.HasField("dynamic_batching"):
        raise ExerciseError(without_batcher)
    return tuned
