"""Exercises at the end of the notebooks, checked against a real Triton server.

:mod:`.registry` holds the API a notebook calls (``exercises.check(name, answer, server)``,
``exercises.task(name)``) and the reference-solution loader; every other module is the checker of
one notebook's exercise. Importing this package imports them all, which registers every exercise.

A new exercise: a module here named after the notebook's topic, a checker decorated with
:func:`exercise`, an import line below, and ``notebooks/solutions/<name>.py``.
"""

# The checkers, in notebook order; imported for their registration.
from lab_backends.lessons.exercises import (  # noqa: F401
    architecture,
    batch_strategy,
    batching,
    c_backend,
    end_to_end,
    executorch,
    frameworks,
    iterative,
    management,
    native_frameworks,
    observability,
    paged_kv,
    pipelines,
    python_backend,
    queue_policy,
    rest_json,
    sequences,
    tracing,
)
from lab_backends.lessons.exercises.registry import (
    EXERCISES,
    SOLUTIONS_DIR,
    Exercise,
    Result,
    check,
    exercise,
    get,
    load_solution,
    solution_path,
    task,
)

__all__ = ["EXERCISES", "SOLUTIONS_DIR", "Exercise", "Result", "check", "exercise", "get", "load_solution",
           "solution_path", "task"]
