"""pytest hooks for the notebooks under nbval: keep the executed outputs for the book.

Not a lesson: ``make test`` runs the notebooks with nbval, and these hooks write what it executed
to ``build/executed/`` so that ``python -m lab_backends.book render`` can build the book from the
same run (see ``lab_backends/book/capture.py``).
"""

from lab_backends.book.capture import pytest_runtest_call, pytest_sessionfinish  # noqa: F401
