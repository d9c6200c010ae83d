"""The exercise registry: :func:`exercise` registers a checker, :func:`check` runs a learner's answer.

A notebook's last cells look like this::

    def request_body(x):            # the learner's answer
        raise NotImplementedError   # ... until they write it

    exercises.check("kserve_json_body", request_body, server)

:func:`check` runs the learner's answer against the server and prints one line: ``✓`` and why it is
right, or ``✗`` and what the checker expected, what the server did with the answer and how to fix
it (the checker's :class:`~lab_backends.errors.ExerciseError`). No traceback through the checker's
source: that is the checker's business, not the learner's; ``traceback=True`` (or ``LAB_TRACEBACK=1``)
raises the error instead, for whoever debugs a checker. An answer that still raises
``NotImplementedError`` is reported as "not attempted yet", so that a fresh notebook runs top to
bottom (and under nbval in CI). ``lab-backends exercises audit`` (:mod:`.audit`) checks every
checker against its skeleton, reference, wrong and alternative answers.

Reference solutions live in ``notebooks/solutions/<exercise>.py`` (each defines ``answer``), and
``tests/test_exercises.py`` runs every one through the same checks, so a solution and its checker
cannot drift apart. Adding an exercise: write a checker, decorate it with :func:`exercise`, add a
solution file.
The checkers live next door, one module per notebook topic (``rest_json``, ``tracing``, ...);
the package ``__init__`` imports them all, so importing :mod:`lab_backends.lessons.exercises` registers
every exercise.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

from lab_backends.client.deadline import requests_within
from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.crash import raise_if_dying
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer

SOLUTIONS_DIR = PROJECT_ROOT / "notebooks" / "solutions"


@dataclass(frozen=True)
class Exercise:
    """One exercise: its task, the models its checker needs, and the checker itself."""

    name: str
    notebook: str
    task: str
    models: tuple[str, ...]
    checker: Callable[..., str]
    #: The checker reads the server's trace file: a server started for it must write one.
    traced: bool = False


@dataclass(frozen=True)
class Result:
    """What :func:`check` found: ``passed`` or not ``attempted``, and a message for the learner."""

    name: str
    attempted: bool
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed


EXERCISES: dict[str, Exercise] = {}


def exercise(name: str, notebook: str, task: str, models: tuple[str, ...], traced: bool = False) -> Callable:
    """Register ``checker(answer, server, **inputs) -> success message`` as exercise ``name``.

    ``models`` are what :func:`check` loads when it has to start a server itself (with a trace
    file when ``traced``); with none, the checker gets ``server=None`` when the learner passes none
    (it may start its own).
    """

    def register(checker: Callable[..., str]) -> Callable[..., str]:
        if name in EXERCISES:
            raise LabBackendsError(f"exercise {name!r} is registered twice")
        EXERCISES[name] = Exercise(name, notebook, task, tuple(models), checker, traced)
        return checker

    return register


def answer_raised(call: str, exc: Exception, server: Any) -> ExerciseError:
    """The refusal of an answer that raised ``exc`` while ``call`` ran, unless the server under it crashed:
    then :class:`~lab_backends.errors.ServerCrashed` is raised instead, naming the crash. A Triton 2.51 crash
    (docs/reliability.md) is the server's doing, not a verdict on the answer, and the learner's client
    sees it only as a closed connection."""
    raise_if_dying(server)
    first = str(exc).splitlines()[0] if str(exc) else ""
    return ExerciseError(f"{call} raised {type(exc).__name__}: {first[:300]}")


def get(name: str) -> Exercise:
    if name not in EXERCISES:
        raise ExerciseError(f"no exercise named {name!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[name]


def task(name: str) -> str:
    """The task text, for the notebook to print above the answer cell."""
    return get(name).task


#: The deadline of every gRPC request a checker sends without its own (lab_backends/client/deadline.py): far
#: above any lesson's request (the slowest, a queue-policy wait, takes seconds), so only a hang meets it.
CHECK_REQUEST_DEADLINE_S = 60.0


def check(name: str, answer: Any, server: RunningServer | None = None, quiet: bool = False,
          traceback: bool | None = None, **inputs: Any) -> Result:
    """Check ``answer`` for exercise ``name`` against ``server`` (started here with the models if None).

    Returns the :class:`Result` and prints its one line unless ``quiet``. A refused answer does not
    raise unless ``traceback`` is True (default: ``LAB_TRACEBACK=1`` in the environment). ``inputs``
    are what some checkers take from the notebook beside the answer (``batch_of_eight``: the
    learner's ``drawing``); each checker names its own and has a default for every one.
    """
    ex = get(name)
    if traceback is None:
        traceback = os.environ.get("LAB_TRACEBACK", "0") == "1"
    if server is None and ex.models:
        with started_for(ex) as own:
            return check(name, answer, own, quiet, traceback, **inputs)
    try:
        with requests_within(CHECK_REQUEST_DEADLINE_S):  # no request of a check waits for ever
            message = ex.checker(answer, server, **inputs)
    except NotImplementedError as exc:  # a checker may say what "attempting" means for its exercise
        todo = str(exc) or "replace the NotImplementedError with your answer and run the cell again"
        result = Result(name, False, False, f"'{name}' is not attempted yet: {todo}.\nTask: {ex.task}")
    except ExerciseError as exc:
        if traceback:
            raise
        result = Result(name, True, False, f"✗ {name}: {exc}")
    else:
        result = Result(name, True, True, f"✓ {name}: {message}")
    if not quiet:
        print(result.message)
    return result


@contextlib.contextmanager
def started_for(ex: Exercise) -> Iterator[RunningServer]:
    """A server of our own with ``ex.models`` (local and traced, one file part per request, if ``ex.traced``)."""
    with contextlib.ExitStack() as stack:
        traced: dict[str, Any] = {}
        if ex.traced:  # a trace file is ours to read only on a local server
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"exercise-{ex.name}-")))
            traced = {"trace_file": folder / "trace.json", "trace_level": ("TIMESTAMPS",), "trace_rate": 1,
                      "trace_log_frequency": 1, "target": "local"}
        yield stack.enter_context(TritonServer(models=list(ex.models), **traced))


def solution_path(name: str) -> Path:
    return SOLUTIONS_DIR / f"{name}.py"


def load_module(path: Path, module_name: str) -> ModuleType:
    """Run the Python file ``path`` as module ``module_name`` (a solution, an audit case file)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_solution(name: str) -> Any:
    """The ``answer`` defined by ``notebooks/solutions/<name>.py``."""
    path = solution_path(name)
    if not path.exists():
        raise ExerciseError(f"no solution file {path}; every exercise needs one (tests run it)")
    module = load_module(path, f"solution_{name}")
    if not hasattr(module, "answer"):
        raise ExerciseError(f"{path} must define `answer` (the function or value the checker takes)")
    return module.answer
