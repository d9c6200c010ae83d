"""Notebook 04's exercise: a preprocessing model written for the Python backend."""

from __future__ import annotations

import ast
import tempfile

import numpy as np

from lab_backends.digits.data import load_split, normalize
from lab_backends.errors import ExerciseError, ModelConfigError
from lab_backends.lessons import authoring
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

PREPROCESS_MODEL = "learner_preprocess"


def _execute_not_written(source: str) -> bool:
    """True when every ``execute`` in ``source`` does nothing but ``raise NotImplementedError``.

    That is the skeleton as handed out; a finished model.py that mentions NotImplementedError
    elsewhere (a comment, an unsupported case) is an attempt, checked like any other.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False  # an attempt that does not parse: the checker says where
    bodies = [[s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
              for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "execute"]
    return bool(bodies) and all(
        len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None
        and "NotImplementedError" in ast.unparse(body[0].exc) for body in bodies)


@exercise(
    "preprocess_backend",
    notebook="04_custom_python_backend",
    task=(
        "Write the source of a model.py (a string) for a Python-backend preprocessing model: input IMAGE, "
        "UINT8 [8, 8] (a raw digit, values 0..16) -> output PIXELS, FP32 [64] = IMAGE / 8 - 1, flattened. "
        "The checker writes it into a fresh repository with a config of its own (max_batch_size 64, dynamic "
        "batching), loads it into a real server through the model-control API and sends real digits: "
        "batches of 1 and 5 images, and 4 requests at once (one execute() gets several requests)."
    ),
    models=(),
)
def _check_preprocess_backend(answer: str | None, server: RunningServer | None) -> str:
    """Serve the learner's source on a server of our own: a broken model must not hurt theirs."""
    if answer is None:
        raise NotImplementedError
    if not isinstance(answer, str):
        raise ExerciseError(f"the answer is the source text of model.py (a str), not {type(answer).__name__}")
    if _execute_not_written(answer):
        raise NotImplementedError(
            "execute() still only raises NotImplementedError: write its body in MY_PREPROCESS, then run this "
            "cell again")
    config = authoring.python_config(
        PREPROCESS_MODEL,
        [authoring.Tensor("IMAGE", "UINT8", [8, 8])],
        [authoring.Tensor("PIXELS", "FP32", [64])],
        max_batch_size=64, dynamic_batching=True, max_queue_delay_us=100_000,
    )
    images = load_split().test_images
    with tempfile.TemporaryDirectory(prefix="exercise-preprocess-") as tmp:
        try:
            authoring.write_model(tmp, answer, config)
        except ModelConfigError as exc:
            raise ExerciseError(str(exc)) from exc
        with TritonServer(model_repository=[tmp], models=[], target="local") as own:
            try:
                own.load_model(PREPROCESS_MODEL)
            except Exception as exc:
                raise ExerciseError(f"the server could not load your model.py: {exc}") from exc
            batches = [images[:1], images[1:6]]
            together = [images[6:7], images[7:9], images[9:12], images[12:13]]
            replies = [authoring.send_together(own, PREPROCESS_MODEL, [{"IMAGE": b}])[0] for b in batches]
            replies += authoring.send_together(own, PREPROCESS_MODEL, [{"IMAGE": b} for b in together])
            for batch, reply in zip(batches + together, replies):
                label = f"a request of {len(batch)} image(s)"
                if isinstance(reply, Exception):
                    raise ExerciseError(f"{label} failed: {reply}")
                if "PIXELS" not in reply:
                    raise ExerciseError(f"{label} came back without PIXELS (outputs: {sorted(reply)})")
                got, want = reply["PIXELS"], normalize(batch)
                if got.shape != want.shape:
                    raise ExerciseError(
                        f"{label}: PIXELS has shape {list(got.shape)}, expected {list(want.shape)}: one row of 64 "
                        "values per image of the request (reshape(len(x), 64), not reshape(-1))"
                    )
                if not np.allclose(got, want, atol=1e-6):
                    worst = int(np.abs(got - want).argmax())
                    raise ExerciseError(
                        f"{label}: PIXELS differs from IMAGE / 8 - 1, e.g. element {worst} is "
                        f"{got.flat[worst]:.4f}, expected {want.flat[worst]:.4f} (did you convert to float32 first?)"
                    )
            executions = own.statistics(PREPROCESS_MODEL)["model_stats"][0]["execution_count"]
    return (
        f"your model.py normalized {sum(len(b) for b in batches + together)} real digits in "
        f"{len(batches + together)} requests exactly, in {executions} execute() calls."
    )
