"""Notebook 00's exercise: predict a model's path (scheduler, backend) from its config.

The learner's ``path_of(config)`` reads the config the server uses and names the scheduler and the
backend. The checker does not restate the rules to grade it: it asks the running server
(:mod:`lab_backends.lessons.request_path`: a request without a correlation ID, the ensemble's
steps' executions, the stub processes and the libraries the server has mapped) and compares, so
the models below were picked for the traps a config sets: an empty ``dynamic_batching { }`` that
still turns the batcher on, a ``max_batch_size`` > 0 under a sequence batcher, a backend named
``sklearn`` that is Python, a C library, an ensemble that runs no backend of its own.
"""

from __future__ import annotations

from typing import Any, Callable

from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.lessons.diagram import SCHEDULERS
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.lessons.request_path import BACKENDS, Observation, observe
from lab_backends.server.running import RunningServer

#: The models asked about, in the order they are checked.
MODELS = ("cost_model", "echo", "c_scale", "running_mean", "digits_logreg", "digits_ensemble")


def _hint(model: str, config: Any, said: tuple[str, str | None], seen: Observation) -> str:
    """Why the prediction differs, in terms of the config field that decides it."""
    hints = []
    if said[0] != seen.scheduler:
        if seen.scheduler == "sequence batcher":
            hints.append("its config has sequence_batching: the sequence batcher serves it (a max_batch_size > 0 "
                         "does not make a dynamic batcher)")
        elif seen.scheduler == "dynamic batcher":
            hints.append("its config has a dynamic_batching section; even an empty one (dynamic_batching { }, no "
                         "queue delay) turns the dynamic batcher on: test config.HasField('dynamic_batching')")
        elif seen.scheduler == "default":
            hints.append("its config has no dynamic_batching and no sequence_batching: the default scheduler, "
                         "one request per execution")
        else:
            hints.append("its platform is 'ensemble': the ensemble scheduler")
    if said[1] != seen.backend:
        if seen.backend is None:
            hints.append("an ensemble runs no backend of its own: answer None")
        elif seen.backend == "python" and (config.backend or config.platform) != "python":
            hints.append(f"the config names backend '{config.backend}', but it is a Python-based backend (a "
                         f"model.py in its backend folder, no libtriton_{config.backend}.so): the Python backend "
                         "runs it, and the live config says runtime: \"model.py\"")
        elif seen.backend == "python":
            hints.append("backend 'python': a stub process per instance")
        else:
            hints.append(f"backend '{config.backend}' is a shared library (libtriton_{config.backend}.so) of "
                         "its own: answer \"C\"")
    return "; ".join(hints)


def _valid(model: str, said: Any) -> tuple[str, str | None]:
    if not isinstance(said, (tuple, list)) or len(said) != 2:
        raise ExerciseError(f"path_of({model}'s config) returned {said!r}: return two things, "
                            "(scheduler, backend)")
    scheduler, backend = said
    if scheduler not in SCHEDULERS:
        raise ExerciseError(f"path_of({model}'s config) named scheduler {scheduler!r}; name one of "
                            f"{', '.join(repr(s) for s in SCHEDULERS)}")
    if backend not in BACKENDS:
        raise ExerciseError(f"path_of({model}'s config) named backend {backend!r}; name one of "
                            "'python', 'C' or None")
    return scheduler, backend


@exercise(
    "request_path",
    notebook="00_architecture",
    task=(
        "Write path_of(config): given a model's config as the server uses it (server.model_config(name), a "
        "ModelConfig), return (scheduler, backend): scheduler one of 'default', 'dynamic batcher', "
        "'sequence batcher', 'ensemble'; backend 'python' (the Python backend runs it: a stub process per "
        "instance), 'C' (a shared library libtriton_<name>.so of its own) or None (an ensemble runs no backend "
        f"of its own). The checker asks it about {', '.join(MODELS)} and compares each answer with what the "
        "running server shows: a request without a correlation ID, the ensemble's steps' executions, the stub "
        "processes and the libraries the server has mapped."
    ),
    models=MODELS,
)
def _check_request_path(answer: Callable[[Any], Any], server: RunningServer | None) -> str:
    missing = [m for m in MODELS if not server.model_ready(m)]
    if missing:
        raise ExerciseError(f"{', '.join(missing)} not loaded on this server: call exercises.check without a "
                            "server, and it starts one with every model it asks about")
    wrong = []
    for model in MODELS:
        config = server.model_config(model)
        try:
            said = answer(config)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise ExerciseError(f"path_of({model}'s config) raised {type(exc).__name__}: {exc}") from exc
        said = _valid(model, said)
        try:
            seen = observe(server, model)
        except LabBackendsError as exc:
            raise ExerciseError(f"the server could not show {model}'s path: {exc}") from exc
        if said != (seen.scheduler, seen.backend):
            wrong.append(f"{model}: you said {said}, the server shows ({seen.scheduler!r}, {seen.backend!r}) "
                         f"[{seen.scheduler_evidence}; {seen.backend_evidence}]: {_hint(model, config, said, seen)}")
    if wrong:
        raise ExerciseError(f"{len(wrong)} of {len(MODELS)} paths differ from the server's:\n" + "\n".join(wrong))
    return (f"all {len(MODELS)} paths match what the server showed: the sequence batcher refused a request "
            "without a correlation ID, the ensemble's steps executed, stubs ran the Python models (the sklearn "
            "one too) and libtriton_scale.so served c_scale.")
