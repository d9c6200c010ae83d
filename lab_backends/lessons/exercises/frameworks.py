"""Notebook 05's exercise: get the same logits from all three served frameworks, in chunks."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from lab_backends.digits import reference
from lab_backends.digits.data import normalize
from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.registry import answer_raised, exercise
from lab_backends.lessons.frameworks import MAX_BATCH, WRAPPED, agreement, held_out
from lab_backends.measure import stats as _stats
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

EXERCISE_ROWS = 150


@exercise(
    "framework_agreement",
    notebook="05_wrapping_frameworks",
    task=(
        "Write logits_of(server, model, images) that returns the LOGITS (float32 [n, 10]) that the SERVED "
        "model (digits_torch, digits_onnx or digits_tf) computes for n raw digit images (uint8 [n, 8, 8], "
        "values 0..16). Normalize as the models expect (PIXELS = float32(IMAGE) / 8 - 1, shape [n, 64]); n is "
        "150, more than the models' max_batch_size of 64, so split into requests of at most 64 rows and stitch "
        "the answers back in order. The checker calls it for all three models, compares with the artifacts run "
        "in-process and with each other, and reads the statistics API to see that the server computed every row."
    ),
    models=("digits_torch", "digits_onnx", "digits_tf"),
)
def _check_framework_agreement(
    answer: Callable[[Any, str, np.ndarray], np.ndarray], server: RunningServer | None
) -> str:
    """Checker of exercise ``framework_agreement`` (registered in :mod:`lab_backends.lessons.exercises`).

    The learner's ``logits_of(server, model, images)`` must get LOGITS for 150 raw images from the
    server (more rows than ``max_batch_size``: it has to split), for all three frameworks; the answers
    must match the artifacts run in-process and each other, and the statistics API must show that
    the server, not a local copy, computed every row. ``digits_tf`` is compared with PyTorch run
    in-process (the same weights, 6e-6 apart): importing TensorFlow into the learner's kernel would
    cost ~700 MB for one comparison; the offline check of the SavedModel itself is a test
    (tests/test_digits_tf.py).
    """
    models = tuple(WRAPPED.values())
    images, labels, _ = held_out()
    images, labels = images[:EXERCISE_ROWS], labels[:EXERCISE_ROWS]
    pixels = normalize(images)
    torch_logits = reference.torch_logits(pixels)
    want = {"digits_torch": torch_logits, "digits_onnx": reference.onnx_logits(pixels), "digits_tf": torch_logits}
    got: dict[str, np.ndarray] = {}
    with contextlib.ExitStack() as stack:
        if server is None or not all(server.model_ready(m) for m in models):
            server = stack.enter_context(TritonServer(models=list(models), target="local"))
        for model in models:
            before = _stats.inference_count(server, model)
            try:
                out = answer(server, model, images.copy())
            except (NotImplementedError, ExerciseError):
                raise
            except Exception as exc:
                raise answer_raised(f"logits_of(server, {model!r}, images)", exc, server) from exc
            rows = _stats.rows_since(server, model, before, len(images))
            out = np.asarray(out)
            if out.shape != (len(images), 10):
                raise ExerciseError(f"{model}: expected LOGITS of shape {(len(images), 10)}, got {out.shape}: one row "
                                    "of 10 logits per image, every chunk's rows stitched back in order")
            if rows < len(images):
                raise ExerciseError(f"the server computed {rows} rows for {model}, not {len(images)}: send every "
                                    "image to the served model (no local framework call)")
            if not np.allclose(out, want[model], atol=1e-4):
                bad = int(np.abs(out - want[model]).max(axis=1).argmax())
                raise ExerciseError(
                    f"{model}: row {bad} differs from the model's answer for that image. Is PIXELS = "
                    "float32(IMAGE) / 8 - 1, reshaped to [n, 64], and are the chunks kept in order?")
            got[model] = out
    worst = 0.0
    for other in models[1:]:
        cmp = agreement(got["digits_torch"], got[other], labels)
        if not (cmp["max_abs_diff"] < 1e-5 and cmp["same_labels"]):
            raise ExerciseError(f"digits_torch and {other} disagree: {cmp}")
        worst = max(worst, cmp["max_abs_diff"])
    return (
        f"all three frameworks answered all {len(images)} images through the server (requests of at most "
        f"{MAX_BATCH} rows), {worst:.1e} apart at most, same digits, accuracy {cmp['accuracy_a']:.1%}."
    )
