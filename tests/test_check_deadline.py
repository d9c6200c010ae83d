"""Every gRPC request a checker sends has a deadline (lab_backends/client/deadline.py): a learner's answer that
keeps a request from being answered gets a verdict, not a check that waits for ever (issue 47).

cost_model sleeps at least 10 ms per execution, so a 1 ms deadline is missed on every run, whatever the machine's
speed (a lower bound, not a race); the same request without the deadline is answered.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from lab_backends.client.deadline import current, requests_within
from lab_backends.client.infer import infer
from lab_backends.lessons.exercises import registry
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

X = {"INPUT0": np.ones((1, 16), np.float32)}


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=["cost_model"], target="local") as own:
        yield own


def test_a_request_in_the_block_gets_the_deadline_and_one_outside_does_not(server) -> None:
    assert current() is None
    with requests_within(0.001):
        with pytest.raises(InferenceServerException, match="(?i)deadline"):
            infer(server, "cost_model", X)
        assert infer(server, "cost_model", X, client_timeout=30)["OUTPUT0"].shape == (1, 16)  # its own wins
    assert current() is None
    assert infer(server, "cost_model", X)["OUTPUT0"].shape == (1, 16)


def test_exercises_check_runs_the_checker_within_the_deadline(server, monkeypatch) -> None:
    """``exercises.check`` itself applies it: a checker's plain ``infer`` ends at CHECK_REQUEST_DEADLINE_S."""
    seen: list[float | None] = []

    def checker(answer, own) -> str:
        seen.append(current())
        infer(own, "cost_model", X)
        return "answered"

    monkeypatch.setitem(registry.EXERCISES, "deadline_probe",
                        registry.Exercise("deadline_probe", "none", "none", ("cost_model",), checker))
    monkeypatch.setattr(registry, "CHECK_REQUEST_DEADLINE_S", 0.001)
    with pytest.raises(InferenceServerException, match="(?i)deadline"):
        registry.check("deadline_probe", None, server, quiet=True)
    monkeypatch.setattr(registry, "CHECK_REQUEST_DEADLINE_S", 60.0)
    assert registry.check("deadline_probe", None, server, quiet=True).passed
    assert seen == [0.001, 60.0] and current() is None
