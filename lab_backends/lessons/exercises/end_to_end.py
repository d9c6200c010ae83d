"""Notebook 11's exercise (``batch_of_eight``): its checker lives with the request inspector it uses,
in :mod:`lab_backends.lessons.inspector.exercise`; importing that module registers it."""

from lab_backends.lessons.inspector import exercise as _checker  # noqa: F401 - registers batch_of_eight
