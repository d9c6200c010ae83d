"""lessons/warmup_lesson.py on a real server, fast: what the statistics count right after a cold load.

``cost_model`` (a plain Python model, ~1.5 s a load) stands in for the lesson's torch model: the
counts do not depend on the model. Only deterministic evidence is asserted: the warm-up's
executions are N instances x the sample's count K before any client request, none without a warm-up.
"""

from __future__ import annotations

import math

import pytest

from lab_backends.lessons import warmup_lesson
from lab_backends.measure.stats import fetch_statistics, totals
from lab_backends.server.triton_server import TritonServer

MODEL = "cost_model"


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=[MODEL], target="local") as running:
        yield running


def test_without_model_warmup_nothing_has_run_at_ready(server: TritonServer) -> None:
    run = warmup_lesson.cold_load(server, warm=0, instances=2, later=1, model=MODEL)
    assert (run.executions_at_ready, run.inferences_at_ready) == (0, 0)
    assert run.ready_s > 0 and math.isfinite(run.first_compute_ms) and math.isfinite(run.later_compute_ms)


def test_model_warmup_runs_instances_times_count_before_ready(server: TritonServer) -> None:
    run = warmup_lesson.cold_load(server, warm=3, instances=2, later=1, model=MODEL)
    assert (run.executions_at_ready, run.inferences_at_ready) == (2 * 3, 2 * 3)
    # The client's two requests come on top: the statistics now count 6 + 2 executions.
    assert totals(fetch_statistics(server, MODEL), MODEL).executions == 2 * 3 + 2


def test_a_reload_with_the_same_config_is_an_update_not_a_cold_start(server: TritonServer) -> None:
    """Why cold_load unloads first: loading a READY model again with a config that differs at most in
    instance_group only updates it (model_lifecycle.cc 488-505): no new warm-up, statistics kept."""
    warmup_lesson.cold_load(server, warm=2, instances=1, later=0, model=MODEL)
    before = totals(fetch_statistics(server, MODEL), MODEL).executions
    assert before == 2 + 1
    server.load_model(MODEL, config=server.model_config(MODEL))
    assert totals(fetch_statistics(server, MODEL), MODEL).executions == before


def test_a_request_is_counted_once_its_execution_is_too(monkeypatch) -> None:
    """The backend reports a request, then its execution, after the answer went out: a read in between has the
    success and not the execution (then cold_load's later count of executions was one short). Forced here:
    the first read after the answer has the success only."""
    def payload(success: int, executions: int) -> dict:
        return {"model_stats": [{"name": MODEL, "version": "1", "inference_count": success,
                                 "execution_count": executions,
                                 "inference_stats": {"success": {"count": success, "ns": 0}}}]}

    reads = iter([payload(0, 0), payload(1, 0), payload(1, 1)])
    monkeypatch.setattr(warmup_lesson, "fetch_statistics", lambda server, model: next(reads))
    monkeypatch.setattr(warmup_lesson, "infer", lambda *args, **kwargs: None)
    warmup_lesson._one_request(None, MODEL, {})
    assert next(reads, "all read") == "all read"  # it read on until the execution was counted
