"""lab_backends.lessons.request_path: a model's scheduler and backend as the running server shows them."""

from __future__ import annotations

import pytest

from lab_backends.lessons import request_path
from lab_backends.lessons.request_path import Observation
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import parse_config, read_config
from lab_backends.server.triton_server import TritonServer


def test_instance_names_follow_the_groups() -> None:
    assert request_path.instance_names(parse_config('name: "m"')) == ["m_0_0"]
    two = parse_config('name: "m" instance_group [ { count: 2 }, { name: "g" count: 1 } ]')
    assert request_path.instance_names(two) == ["m_0_0", "m_0_1", "g_0"]


def test_against_diagram_names_each_disagreement() -> None:
    configs = {m: read_config(MODEL_REPOSITORY / m) for m in ("cost_model", "echo")}
    agree = [Observation("cost_model", "dynamic batcher", "python", "", ""),
             Observation("echo", "default", "python", "", "")]
    assert request_path.against_diagram(agree, configs) == {}
    wrong = [Observation("echo", "default", "C", "", "")]
    assert request_path.against_diagram(wrong, configs) == {
        "echo": "drawn ('default', 'python'), shown ('default', 'C (custom)')"}


@pytest.mark.server
def test_the_server_shows_each_path() -> None:
    with TritonServer(models=["echo", "running_mean", "c_scale"], target="local") as server:
        seen = {o.model: o for o in request_path.observe_all(server, ["echo", "running_mean", "c_scale"])}
        with pytest.raises(Exception, match="not loaded"):
            request_path.observe(server, "cost_model")
    assert (seen["echo"].scheduler, seen["echo"].backend) == ("default", "python")
    assert (seen["running_mean"].scheduler, seen["running_mean"].backend) == ("sequence batcher", "python")
    assert request_path.NO_CORRELATION_ID in seen["running_mean"].scheduler_evidence
    assert (seen["c_scale"].scheduler, seen["c_scale"].backend) == ("dynamic batcher", "C")
    assert "libtriton_scale.so" in seen["c_scale"].backend_evidence
    assert "stub process" in seen["echo"].backend_evidence and "echo_0_0" in seen["echo"].backend_evidence
    assert list(request_path.table(seen.values()).index) == ["echo", "running_mean", "c_scale"]
