"""Notebook 09's exercise: complete the ``clip`` C backend; the checker lives in :mod:`..c_lab`.

The checker builds, installs and serves the learner's C file on a server of its own (a crashing
backend must not take the learner's server down), so it needs no models from the caller.
"""

from __future__ import annotations

from lab_backends.lessons import c_lab
from lab_backends.lessons.exercises.registry import exercise

exercise(c_lab.NAME, notebook="09_backend_c_api", task=c_lab.TASK, models=())(c_lab.check_clip_answer)
