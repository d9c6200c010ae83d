"""The ``lab`` fixture (a real JupyterLab on 127.0.0.1 with a token) for every browser test."""

from .test_lab_in_browser import lab  # noqa: F401 - a fixture, found by name
