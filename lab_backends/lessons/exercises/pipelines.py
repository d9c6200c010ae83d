"""Notebook 06's exercise: an ensemble whose preprocessing step is the C backend model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from lab_backends.client.infer import infer
from lab_backends.digits.data import load_split
from lab_backends.errors import ExerciseError, ModelConfigError
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.lessons.pipelines import same_answer
from lab_backends.measure import stats as _stats
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import ModelConfig, config_text, parse_config, read_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

LEARNER_ENSEMBLE = "my_ensemble_c"
EXERCISE_ROWS = 24


@exercise(
    "ensemble_with_c_preprocess",
    notebook="06_pipelines",
    task=(
        "Write my_ensemble(config) that takes a copy of digits_ensemble's config (a ModelConfig protobuf) and "
        "returns the config of a new ensemble named 'my_ensemble_c' that preprocesses with the C backend model "
        "digits_preprocess_c instead of digits_preprocess (same tensors, same other steps). Return a ModelConfig "
        "or config.pbtxt text. The checker serves it from a scratch repository on a server of its own, sends "
        "24 real digits, compares with digits_ensemble, and reads the statistics of both preprocessing models."
    ),
    models=(),
)
def _check_ensemble_with_c_preprocess(answer: Callable[[Any], Any], server: RunningServer | None) -> str:
    """Checker of exercise ``ensemble_with_c_preprocess`` (registered in :mod:`lab_backends.lessons.exercises`).

    ``answer(config)`` gets a copy of ``digits_ensemble``'s config and returns the config (a
    ``ModelConfig`` or ``config.pbtxt`` text) of an ensemble named ``my_ensemble_c`` that runs
    ``digits_preprocess_c`` instead of ``digits_preprocess``. It is served from a scratch
    repository by a server of the checker's own (a broken ensemble cannot hurt the learner's),
    must answer like ``digits_ensemble``, and the statistics must show the C model did the work.
    """
    given = read_config(MODEL_REPOSITORY / "digits_ensemble")
    config = answer(given)
    if isinstance(config, str):
        try:
            config = parse_config(config, "your config")
        except ModelConfigError as exc:
            raise ExerciseError(str(exc)) from exc
    if not isinstance(config, ModelConfig):
        raise ExerciseError(f"return a ModelConfig (or config.pbtxt text), not {type(config).__name__}")
    if config.name != LEARNER_ENSEMBLE:
        raise ExerciseError(
            f"name the ensemble {LEARNER_ENSEMBLE!r} (it is {config.name!r}): two models cannot share a name"
        )
    steps = [s.model_name for s in config.ensemble_scheduling.step]
    if "digits_preprocess_c" not in steps or "digits_preprocess" in steps:
        raise ExerciseError(f"the steps call {steps}: replace digits_preprocess by digits_preprocess_c")
    images = load_split().test_images[:EXERCISE_ROWS]
    needed = ["digits_preprocess", "digits_preprocess_c", "digits_onnx", "digits_postprocess", "digits_ensemble"]
    with tempfile.TemporaryDirectory(prefix="exercise-ensemble-") as tmp:
        folder = Path(tmp) / LEARNER_ENSEMBLE
        (folder / "1").mkdir(parents=True)  # an ensemble has no files, but a version folder must exist
        (folder / "config.pbtxt").write_text(config_text(config))
        with TritonServer(model_repository=[MODEL_REPOSITORY, Path(tmp)], models=needed, target="local") as own:
            try:
                own.load_model(LEARNER_ENSEMBLE)
            except Exception as exc:
                raise ExerciseError(f"the server refused to load your ensemble: {str(exc)[:500]}") from exc
            before = {m: _stats.inference_count(own, m) for m in ("digits_preprocess", "digits_preprocess_c")}
            try:
                mine = infer(own, LEARNER_ENSEMBLE, {"IMAGE": images})
            except Exception as exc:
                raise ExerciseError(f"your ensemble loaded but a request failed: {str(exc)[:500]}") from exc
            moved = {"digits_preprocess_c": _stats.rows_since(own, "digits_preprocess_c",
                                                              before["digits_preprocess_c"], len(images))}
            moved["digits_preprocess"] = _stats.inference_count(own, "digits_preprocess") - before["digits_preprocess"]
            reference = infer(own, "digits_ensemble", {"IMAGE": images})
    missing = {"LABELS", "PROBS"} - set(mine)
    if missing:
        raise ExerciseError(f"the ensemble's outputs lack {sorted(missing)}: map the last step's outputs to them")
    if not same_answer(mine, reference):
        raise ExerciseError("your ensemble answers differently from digits_ensemble on the same images")
    if moved["digits_preprocess_c"] != len(images) or moved["digits_preprocess"] != 0:
        raise ExerciseError(f"rows preprocessed per model during your request: {moved}; expected all "
                            f"{len(images)} in digits_preprocess_c")
    return (f"{LEARNER_ENSEMBLE} ran {' -> '.join(steps)}: the C backend preprocessed all {len(images)} images "
            "and the answers equal digits_ensemble's.")
