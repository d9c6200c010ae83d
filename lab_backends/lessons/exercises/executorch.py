"""Notebook 09d's exercise: the binding of ExecuTorch's runtime in lab_executorch; the checker lives in
:mod:`lab_backends.lessons.executorch_exercise`.

The checker builds, installs and serves the learner's C++ file on a server of its own (a crashing
binding must not take the learner's server down), so it needs no models from the caller.
"""

from __future__ import annotations

from lab_backends.lessons import executorch_exercise
from lab_backends.lessons.exercises.registry import exercise

exercise(executorch_exercise.NAME, notebook="09d_bringing_up_a_new_framework", task=executorch_exercise.TASK,
         models=())(executorch_exercise.check_binding)
