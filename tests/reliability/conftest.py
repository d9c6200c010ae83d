"""Fixtures of the reliability suite: test-only models and servers that serve them.

Test-only models live in ``tests/reliability/models`` and are served next to the project's
``model_repository`` (for ``cost_model``), never copied into it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.triton_server import TritonServer

TEST_MODELS = Path(__file__).resolve().parent / "models"
REPOSITORIES = [TEST_MODELS, MODEL_REPOSITORY]


def fast_cost_model(server: TritonServer) -> None:
    """Reload ``cost_model`` with zero sleep (fixed_ms=0, per_item_ms=0) through a config override.

    The override replaces the whole config, so it is derived from the server's own config.
    """
    config = server.model_config("cost_model")
    for key in ("fixed_ms", "per_item_ms"):
        config.parameters[key].string_value = "0"
    server.load_model("cost_model", config=config)


def known_good(server: TritonServer, protocol: str = "grpc") -> None:
    """Assert the server still serves: one request with a known answer."""
    from lab_backends.client.infer import infer

    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    out = infer(server, "rel_double", {"INPUT0": x}, protocol=protocol)["OUTPUT0"]
    np.testing.assert_array_equal(out, 2 * x)


#: Everything the shared server serves: the reference, the misbehaving models and cost_model.
SHARED_MODELS = ["rel_double", "rel_raise", "rel_wrong_count", "rel_crash", "cost_model"]


@pytest.fixture(scope="package")
def rel_server():
    """One server for this package's tests (a start costs ~5-10 s on a busy machine).

    Package scope: it stops after the last reliability test, not at the end of ``make test``.

    Tests that hurt it (kill stubs, reload models) leave it healthy again, and tests that count
    (statistics) work with differences, so the order of tests does not matter.
    """
    with TritonServer(REPOSITORIES, models=SHARED_MODELS) as server:
        yield server


@pytest.fixture
def scratch_repo(tmp_path: Path):
    """A fresh repository holding a copy of ``rel_double``; tests break copies of it."""
    repo = tmp_path / "repo"
    shutil.copytree(TEST_MODELS / "rel_double", repo / "rel_double", ignore=shutil.ignore_patterns("__pycache__"))
    return repo
