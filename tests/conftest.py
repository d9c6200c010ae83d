"""Shared fixtures. Every server a test starts is stopped by PID, whether the test passes or not."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_backends.server.triton_server import TritonServer  # noqa: E402

#: LAB_FAST=1 shrinks loads (CI sets nothing: full sizes are sized to fit the budget already).
FAST = os.environ.get("LAB_FAST", "0") == "1"


@pytest.fixture(scope="session")
def split():
    """The fixed digits split (train/test images and labels) that every digits model is built from."""
    from lab_backends.digits import load_split

    return load_split()


@pytest.fixture
def start_server():
    """Factory: ``start_server(models=[...], **options)`` -> a started TritonServer, stopped after the test."""
    started: list[TritonServer] = []

    def _start(**kwargs) -> TritonServer:
        server = TritonServer(**kwargs)
        started.append(server)
        server.start()
        return server

    yield _start
    for server in started:
        server.stop()
