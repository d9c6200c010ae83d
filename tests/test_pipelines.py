"""lab_backends.lessons.pipelines against a real, traced server: ensemble, BLS and client give the same
answer, control is shown from config and code, the traces have parents and children, and the
notebook-06 exercise accepts its solution and rejects wrong answers."""

from __future__ import annotations

import pytest

from lab_backends.errors import LabBackendsError
from lab_backends.lessons import frameworks, pipelines
from lab_backends.measure import trace
from lab_backends.server.triton_server import TritonServer


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    trace_file = tmp_path_factory.mktemp("pipelines-trace") / "trace.json"
    with TritonServer(models=list(pipelines.MODELS), target="local", trace_file=trace_file,
                      trace_log_frequency=1) as started:
        yield started, trace_file


@pytest.fixture(scope="module")
def images():
    return frameworks.held_out()[0]


@pytest.mark.server
def test_every_way_gives_the_same_answer(traced, images) -> None:
    server, _ = traced
    results = pipelines.answers(server, images[:8])
    assert set(results) == set(pipelines.WAYS)
    for way, result in results.items():
        assert result["LABELS"].shape == (8, 3), way
        assert pipelines.same_answer(results["ensemble"], result), way
    with pytest.raises(LabBackendsError, match="unknown way"):
        pipelines.run(server, "bls:tensorflow", images[:1])


@pytest.mark.server
def test_control_is_shown_from_config_and_code(traced) -> None:
    server, _ = traced
    steps = pipelines.ensemble_steps(server.model_config("digits_ensemble"))
    assert steps["model"].tolist() == list(pipelines.STEPS)
    assert steps.loc[1, "inputs"] == "PIXELS <- pixels"
    with pytest.raises(LabBackendsError, match="not an ensemble"):
        pipelines.ensemble_steps(server.model_config("digits_bls"))
    assert "async_exec" not in pipelines.bls_source("_pipeline") and "_call" in pipelines.bls_source("_pipeline")
    assert "async_exec" in pipelines.bls_source("_call")
    with pytest.raises(LabBackendsError, match="no function"):
        pipelines.bls_source("nope")


@pytest.mark.server
def test_traces_have_parents_and_children(traced, images) -> None:
    server, trace_file = traced
    for way in ("ensemble", "bls:torch"):
        pipelines.run(server, way, images[:1], request_id=f"t-{way}")
    log = trace.read_trace(trace_file, request_ids=["t-ensemble", "t-bls:torch"])
    ens = pipelines.family_breakdown(log, "t-ensemble", "digits_ensemble")
    bls = pipelines.family_breakdown(log, "t-bls:torch", "digits_bls")
    assert ens["children"] == bls["children"] == 3
    assert 0 < ens["children_ms"] and 0 < bls["children_ms"] < bls["parent_ms"]
    kids = log.children(int(log.request("t-bls:torch", model="digits_bls")["trace_id"]))
    assert kids["model"].tolist() == ["digits_preprocess", "digits_torch", "digits_postprocess"]


@pytest.mark.server
def test_latencies_interleaved(traced, images) -> None:
    server, _ = traced
    frame = pipelines.latencies(server, images[:1], ways=("ensemble", "client:onnx"), repeats=4, warmup=1)
    assert len(frame) == 8 and frame["way"].tolist()[:2] == ["ensemble", "client:onnx"]
    summary = pipelines.latency_summary(frame)
    assert set(summary.index) == {"ensemble", "client:onnx"} and (summary["requests"] == 4).all()




@pytest.mark.server
def test_traced_glue_is_a_median_per_parent(traced, images) -> None:
    """Shape only: the timing claims on it are the notebook's (checked there, re-measured once)."""
    server, trace_file = traced
    glue = pipelines.traced_glue(server, trace_file, images[:1], repeats=3)
    assert list(glue.index) == list(pipelines.PARENTS)
    assert (glue["children"] == 3).all()
    assert (glue["children_ms"] > 0).all() and (glue["glue_ms"] < glue["parent_ms"]).all()
