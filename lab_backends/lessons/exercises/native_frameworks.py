"""Notebook 09c's exercise: the gather and scatter of the C TensorFlow backend; the checker lives in
:mod:`lab_backends.lessons.native_exercise`.

The checker builds, installs and serves the learner's C file on a server of its own (a crashing
backend must not take the learner's server down), so it needs no models from the caller.
"""

from __future__ import annotations

from lab_backends.lessons import native_exercise
from lab_backends.lessons.exercises.registry import exercise

exercise(native_exercise.NAME, notebook="09c_native_framework_backends", task=native_exercise.TASK,
         models=())(native_exercise.check_gather_scatter)
