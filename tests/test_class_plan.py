"""The class planner: queueing arithmetic on streams whose answer is known, the measured footprint
file it plans from, and the ``lab-backends plan-class`` command."""

from __future__ import annotations

import pytest

from lab_backends import cli
from lab_backends.errors import LabBackendsError
from lab_backends.measure import class_plan


def _footprint(requests_at_once: int, busy_ms: float) -> dict:
    """One notebook whose stream is ``requests_at_once`` requests in its first interval."""
    return {"nb": {"wall_s": 10.0, "peak_server_rss_mb": 200.0, "peak_kernel_rss_mb": 300.0, "server_cpu_s": 2.0,
                   "kernel_cpu_s": 3.0,
                   "stream": [[0.5, "m", requests_at_once, 0, int(requests_at_once * busy_ms * 1e6)]]}}


def test_fifo_queueing_on_one_and_two_replicas() -> None:
    fp = _footprint(1, 100.0)  # each learner: one request of 100 ms, all at the same instant
    reqs = class_plan.arrivals(fp, learners=4, stagger_s=0.0, think_s=0.0)
    assert len(reqs) == 4 and len({t for t, *_ in reqs}) == 1
    service = class_plan.service_times(fp)
    assert service == {"m": pytest.approx(0.1)}
    one = class_plan.simulate(reqs, service, replicas=1)
    assert one.max_ms == pytest.approx(400.0) and one.p50_ms == pytest.approx(200.0)  # 100, 200, 300, 400
    two = class_plan.simulate(reqs, service, replicas=2)
    assert two.max_ms == pytest.approx(200.0)
    faster = class_plan.simulate(reqs, service, replicas=1, speedup=4.0)
    assert faster.max_ms == pytest.approx(100.0)
    both = class_plan.simulate(reqs, service, replicas=1, instances=2)
    assert both.max_ms == pytest.approx(200.0)


def test_plan_searches_the_fewest_replicas_that_meet_the_bound() -> None:
    fp = _footprint(1, 100.0)
    result = class_plan.plan(6, p99_bound_ms=250.0, stagger_s=0.0, think_s=0.0, footprint=fp)
    assert result["replicas"] == 3 and result["meets_bound"]  # 2 learners per replica: 100, 200 ms
    assert [o.replicas for o in result["outcomes"]] == [1, 2, 3]
    res = result["resources"]
    assert res["worst_notebook_peak_mb"] == 500.0 and res["memory_request_mb"] >= 500
    assert "sticky" in class_plan.report(result)


def test_batching_serves_a_burst_in_fewer_executions() -> None:
    fp = _footprint(1, 100.0)
    fp["nb"]["batches"] = {"m": {"1": [10, 10 * 110_000_000], "4": [10, 10 * 140_000_000]}}
    cost = class_plan.execution_costs(fp)["m"]
    assert cost.max_batch == 4
    assert cost.fixed_s == pytest.approx(0.1) and cost.per_item_s == pytest.approx(0.01)
    reqs = class_plan.arrivals(fp, learners=4, stagger_s=0.0, think_s=0.0)
    # All four arrive together: one execution of 4 = 140 ms for everyone (FIFO alone: up to 440 ms).
    assert class_plan.simulate(reqs, {"m": cost}, replicas=1).max_ms == pytest.approx(140.0)


def test_staggered_starts_queue_less() -> None:
    fp = _footprint(5, 20.0)
    service = class_plan.service_times(fp)
    together = class_plan.simulate(class_plan.arrivals(fp, 20, 0.0, 0.0), service, 1)
    staggered = class_plan.simulate(class_plan.arrivals(fp, 20, 600.0, 0.0), service, 1)
    assert staggered.p99_ms < together.p99_ms


def test_measured_footprint_feeds_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    footprint = class_plan.load_footprint()  # bench/scale/footprint.json, committed with docs/scale.md
    assert len(footprint) >= 10 and any(nb["stream"] for nb in footprint.values())
    assert cli.main(["plan-class", "--learners", "30", "--gpu-replicas", "2"]) == 0
    out = capsys.readouterr().out
    assert "30 learners" in out and "2 replica(s)" in out and "per learner pod" in out


def test_missing_footprint_says_how_to_make_it(tmp_path) -> None:
    with pytest.raises(LabBackendsError, match="measure_footprint.py"):
        class_plan.load_footprint(tmp_path / "none.json")


def test_footprint_counts_requests_across_a_model_reload() -> None:
    from lab_backends.measure.footprint import interval_counts

    assert interval_counts((10, 500, 300, 4), (16, 800, 420, 6)) == (6, 300, 120, 2)
    # A config change reloaded the model: Triton restarted its statistics at zero.
    assert interval_counts((120, 9000, 5000, 30), (7, 350, 200, 2)) == (7, 350, 200, 2)
    assert interval_counts((0, 0, 0, 0), (0, 0, 0, 0)) == (0, 0, 0, 0)


def test_notebooks_that_change_models_do_not_use_a_shared_server() -> None:
    """A lesson that reloads, loads or overrides a model would change it for the whole class: on a
    shared server (TRITON_URL, no admin key) it must fall back to the learner's embedded Triton."""
    import re

    from lab_backends.paths import lesson_notebooks

    changes = re.compile(r"apply_config\(|load_model\(|repository_index\(|unload_model\(|reload\(|enable_cache\(|"
                         r"rate_limited\(|upload_model\(|_burst\(|gil_compare\(|batch_timeline\(|average_batches\(")
    local = class_plan.local_notebooks()
    offenders = [path.stem for path in lesson_notebooks()
                 if changes.search(class_plan.notebook_code(path)) and path.stem not in local]
    assert not offenders, f"these notebooks change models but would run on a shared server: {offenders}"
    assert {"00_architecture", "03b_inside_the_scheduler", "10_observability_and_caching",
            "11_one_request_end_to_end"} <= local


def test_servers_with_their_own_backends_or_repository_never_follow_triton_url() -> None:
    """``TritonServer(...)`` with a ``backend_dir`` or its own repository only makes sense locally; without
    ``target=`` it would follow TRITON_URL to the shared server (the lessons would then miss their models)."""
    import re

    from lab_backends.paths import lesson_notebooks

    missing = []
    for path in lesson_notebooks():
        source = class_plan.notebook_code(path)
        for start in (m.end() for m in re.finditer(r"TritonServer\(", source)):
            depth, end = 1, start
            while depth and end < len(source):
                depth += {"(": 1, ")": -1}.get(source[end], 0)
                end += 1
            call = source[start:end]
            own = ("backend_dir=" in call or "model_repository=" in call
                   or not call.lstrip().startswith(("models=", ")")))
            if own and "target=" not in call:
                missing.append(f"{path.stem}: TritonServer({call.strip()[:60]}")
    assert not missing, "these servers would follow TRITON_URL; pass target=...:\n" + "\n".join(missing)
