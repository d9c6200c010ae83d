"""The load generator, sweeps, widget panel and bench against a real tritonserver (cost_model).

cost_model costs 10 ms + 0.2 ms/item per execution, so what batching must do is known: at 8 in
flight, one instance without batching serves ~90 req/s at most, with batching several times more.
Speed is not asserted beyond ratios with wide margins; counts are asserted exactly.
"""

from __future__ import annotations

import asyncio
import csv
import html
import shutil

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from lab_backends.errors import LoadSettingError
from lab_backends.lessons.exercises.registry import get
from lab_backends.measure import plots
from lab_backends.measure.loadgen import example_inputs, run_closed, run_open
from lab_backends.measure.sweep import NO_BATCHING, sweep
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.config_changes import apply_config, derive_config
from lab_backends.server.repository import read_config
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server
MODEL = "cost_model"
#: Full batches at 8 in flight: the batch closes when the 8th request is in (preferred size 8), so the delay
#: costs nothing here; it is how long the batcher waits for a slow client's 8 sends. At 20 ms, a round whose
#: sends spread over more (CI's slow turn-around: 33 ms a round) closed a batch early, and at 40 ms a batch the
#: two parts never joined again (the part left waiting has always waited its 20 ms by the time the instance
#: frees): every later round ran as two batches, avg_batch exactly 4. At 100 ms the batcher waits out three
#: times CI's turn-around, and a split heals in the next round (the waiting part is still within its delay
#: when the other part is back: 41.6 ms + turn-around < 100 ms). A probe here, 8 clients each waiting 0-34 ms
#: after an answer: at 20 ms one such round left batches of 2 and 6 for the rest of the window (avg 4.21),
#: every round such 3.64, 0-67 ms 3.08; at 100 ms 8.00 in all three.
BATCH8 = {"dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 100000}}


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=[MODEL]) as started:
        yield started


@pytest.fixture
def fresh(server):
    """Each test leaves the model as committed: loaded again with config.pbtxt's own config.

    Not a load without a config: that keeps the last override while the files are unchanged
    (``TritonServer.load_model``), so the panel test's unbatched config reached the next test.
    """
    yield server
    server.load_model(MODEL, read_config(MODEL_REPOSITORY / MODEL))


# ------------------------------------------------------------------------------ no server needed


def test_derive_config_changes_only_what_is_named():
    base = read_config(MODEL_REPOSITORY / MODEL)
    off = derive_config(base, NO_BATCHING)
    assert not off.HasField("dynamic_batching") and base.HasField("dynamic_batching")
    assert [i.name for i in off.input] == ["INPUT0"] and off.max_batch_size == 64  # the rest is kept
    tuned = derive_config(base, {
        **BATCH8,
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
        "parameters": {"fixed_ms": {"string_value": "3"}},
    })
    assert list(tuned.dynamic_batching.preferred_batch_size) == [8]
    assert tuned.instance_group[0].count == 2 and len(tuned.instance_group) == 1
    assert tuned.parameters["fixed_ms"].string_value == "3"
    assert tuned.parameters["per_item_ms"].string_value == "0.2"  # maps merge, they are not replaced
    # deterministic: map fields (parameters) are otherwise serialized in no fixed order
    assert (derive_config(base, lambda c: c).SerializeToString(deterministic=True)
            == base.SerializeToString(deterministic=True))
    with pytest.raises(LoadSettingError, match="not a model config field"):
        derive_config(base, {"dynamic_batch": {}})
    with pytest.raises(LoadSettingError, match="bad value for config field 'max_batch_size'"):
        derive_config(base, {"max_batch_size": "many"})


def test_example_inputs_follow_the_config():
    config = read_config(MODEL_REPOSITORY / MODEL)
    inputs = example_inputs(config, batch=3)
    assert inputs["INPUT0"].shape == (3, 16) and inputs["INPUT0"].dtype == np.float32


# ------------------------------------------------------------------------------------ the loops


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_closed_loop_client_and_server_count_the_same_window(fresh, protocol):
    result = run_closed(fresh, MODEL, 4, protocol=protocol, requests=40, duration_s=30, warmup_requests=8)
    s = result.summary
    assert (s["requests"], s["ok"], s["errors"]) == (40, 40, 0), s["first_error"]
    frame = result.requests
    assert list(frame.columns) == ["scheduled_s", "start_s", "end_s", "latency_ms", "ok", "error"]
    assert (frame["latency_ms"] >= 10.0).all()  # every request waits for a >= 10 ms execution
    assert s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"]
    # The statistics were snapshotted with nothing in flight: exactly the measured requests.
    assert result.server.requests == 40
    assert sum(size * n for size, n in result.server.batch_hist.items()) == 40
    # Never more than 4 in flight, so never a batch larger than 4.
    assert max(result.server.batch_hist) <= 4
    assert len(result.warmup) == 8


def test_the_window_is_bounded_by_time(fresh):
    result = run_closed(fresh, MODEL, 2, protocol="http", requests=10**6, duration_s=1.0, warmup_requests=0,
                        metrics_every_s=0.25)
    assert 10 < result.summary["requests"] < 1000
    assert result.summary["window_s"] < 3.0
    # Prometheus sampled along the way: the counters only grow, up to what the window served.
    timeline = result.metrics_timeline
    assert len(timeline) >= 3 and timeline["t_s"].is_monotonic_increasing
    assert timeline["nv_inference_request_success"].is_monotonic_increasing
    assert timeline["nv_inference_request_success"].iloc[-1] <= result.server.requests
    assert timeline["throughput_rps"].iloc[1:].max() > 0
    plots.metrics_over_time(result)
    plt.close("all")


def test_errors_are_counted_with_the_server_message(fresh):
    bad = {"WRONG": np.zeros((1, 16), np.float32)}
    for protocol in ("grpc", "http"):
        result = run_closed(fresh, MODEL, 2, protocol=protocol, inputs=bad, requests=6, warmup_requests=0)
        assert result.summary["errors"] == 6 and result.summary["ok"] == 0
        assert "WRONG" in result.summary["first_error"]


def test_bad_load_settings_are_refused(fresh):
    with pytest.raises(LoadSettingError, match="concurrency must be >= 1"):
        run_closed(fresh, MODEL, 0)
    with pytest.raises(LoadSettingError, match="protocol must be one of"):
        run_closed(fresh, MODEL, 1, protocol="smtp", requests=1)
    with pytest.raises(LoadSettingError, match="rate_rps"):
        run_open(fresh, MODEL, 0)


def test_open_loop_shows_the_queue_that_a_closed_loop_hides(fresh):
    apply_config(fresh, MODEL, NO_BATCHING)  # ~90 req/s at most
    light = run_open(fresh, MODEL, 30, requests=30, duration_s=5, warmup_requests=5)
    assert light.summary["errors"] == 0 and light.server.requests == light.summary["ok"] == 30
    assert 10 < light.summary["offered_rps"] < 90  # Poisson around 30/s
    # Offer ~2x what one execution at a time can serve: the queue (and latency) keeps growing.
    heavy = run_open(fresh, MODEL, 180, requests=150, duration_s=1.5, warmup_requests=0)
    frame = heavy.requests.sort_values("scheduled_s")
    third = len(frame) // 3
    early, late = frame["latency_ms"].iloc[:third].median(), frame["latency_ms"].iloc[-third:].median()
    assert late > 2 * early
    assert heavy.server.queue_ms > 5 * light.server.queue_ms
    # The same offered load as a closed loop: the latency stays flat and the throughput just caps.
    closed = run_closed(fresh, MODEL, 1, requests=40, warmup_requests=4)
    assert closed.summary["p99_ms"] < late


def test_a_run_from_inside_a_running_event_loop(fresh):
    """Jupyter runs cells inside an event loop: the load then runs on a worker thread's loop."""

    async def cell():
        return run_closed(fresh, MODEL, 2, requests=10, warmup_requests=2)

    result = asyncio.run(cell())
    assert result.summary["ok"] == 10


# --------------------------------------------------------------------------- sweeps and plots


#: 40 ms a batch, not the committed 10: the ratio below must survive a slow client. Unbatched, 8 in
#: flight wait on the server (25 req/s whatever the client does); batched, each round of 8 costs
#: 41.6 ms on the server plus the client's turn-around. CI's slow turn-around of 33 ms per round
#: gave 1.96x at 10 ms (stop 51, failed against 2x); at 40 ms even twice that turn-around
#: (8 / (41.6 + 66) ms = 74 req/s) keeps 3x.
SLOW = {"parameters": {"fixed_ms": {"string_value": "40"}}}


def test_batching_raises_throughput_in_a_tidy_sweep(fresh):
    before = fresh.model_config(MODEL)
    frame = sweep(fresh, MODEL, [1, 8], {"none": {**NO_BATCHING, **SLOW}, "dynamic": {**BATCH8, **SLOW}},
                  requests=80, duration_s=3, warmup_requests=16, progress=False)
    assert len(frame) == 4
    assert list(frame["config"]) == ["none", "none", "dynamic", "dynamic"]
    assert list(frame["concurrency"]) == [1, 8, 1, 8]
    for column in ("throughput_rps", "p50_ms", "p90_ms", "p99_ms", "avg_batch", "server_queue_ms",
                   "server_compute_infer_ms", "batch_hist", "model", "protocol"):
        assert column in frame.columns
    assert (frame["errors"] == 0).all()
    none = frame[(frame.config == "none") & (frame.concurrency == 8)].iloc[0]
    dyn = frame[(frame.config == "dynamic") & (frame.concurrency == 8)].iloc[0]
    assert none.avg_batch == 1.0 and dyn.avg_batch > 4
    assert dyn.throughput_rps > 2 * none.throughput_rps, frame[["config", "concurrency", "throughput_rps"]]
    assert dyn.p50_ms < none.p50_ms
    # The config that was live before the sweep is back.
    assert fresh.model_config(MODEL).dynamic_batching == before.dynamic_batching

    fig = plots.batching_figure(frame, title="cost_model")
    assert len(fig.axes) >= 4
    plots.server_breakdown(frame)
    plots.over_time(run_closed(fresh, MODEL, 2, requests=20, warmup_requests=0))
    plt.close("all")


# ------------------------------------------------------------------------------ widget panel


def test_panel_runs_headlessly_and_reports_bad_settings(fresh):
    from lab_backends.lessons.widgets import BatchingPanel

    panel = BatchingPanel(fresh, MODEL, requests=60, duration_s=3)
    panel.concurrency.value = 8
    panel.dynamic.value = True
    panel.max_queue_delay.value = 50000  # the slider's most: batches close at 8, the delay only waits for a slow client
    panel.preferred.value = "8"
    panel.instances.value = 1
    panel.run_button.click()  # what a learner's click does
    assert panel.error == "", panel.error
    assert len(panel.history) == 1 and panel.history.iloc[0]["ok"] == 60
    assert panel.history.iloc[0]["avg_batch"] > 4
    assert panel.image.value[:4] == b"\x89PNG"
    assert "req/s" in panel.status.value
    assert list(fresh.model_config(MODEL).dynamic_batching.preferred_batch_size) == [8]

    panel.preferred.value = "4, eight"
    assert panel.run() is None
    assert "whole numbers" in panel.status.value and "Traceback" not in panel.status.value
    assert len(panel.history) == 1

    panel.preferred.value = "128"  # larger than max_batch_size 64: Triton refuses the config
    assert panel.run() is None
    assert "Triton refused" in panel.status.value and "Traceback" not in panel.status.value
    assert "preferred size must be <= max batch size" in html.unescape(panel.status.value), panel.error
    # A refused reload leaves the previous config serving.
    assert run_closed(fresh, MODEL, 1, requests=3, warmup_requests=0).summary["ok"] == 3

    panel.preferred.value = ""
    panel.dynamic.value = False
    row = panel.run()
    assert row is not None and row["avg_batch"] == 1.0, panel.error
    assert len(panel.history) == 2


# ------------------------------------------------------------------------------------- bench


def test_bench_writes_its_files_with_the_agreed_columns(tmp_path, monkeypatch):
    from lab_backends.measure import bench
    from lab_backends.measure.bench import BATCHING_COLUMNS, LOADGEN_COLUMNS, STRATEGY_BUDGET, batching_bench
    from lab_backends.measure.reference_tools import CYCLE_COLUMNS

    # The bench's dynamic config with a 200 ms delay instead of its 20: batches still close at 16 (preferred), the
    # delay only waits for a slow client's 16 sends. At 20 ms, a client whose sends spread over 0-67 ms (CI's slow
    # turn-around, 33 ms for 8) ran batches of 6.7 on average over a whole window (4.4 at twice that), below the
    # 12 asserted below; at 200 ms, 16.0 at both (a probe here, 160 requests each).
    monkeypatch.setitem(bench.DYNAMIC, MODEL, {"dynamic_batching": {
        **bench.DYNAMIC[MODEL]["dynamic_batching"], "max_queue_delay_microseconds": 200000}})
    out = batching_bench(tmp_path, models=[MODEL], progress=False, log=lambda m: None,
                         requests=40, duration_s=1.0, loadgen_s=1.0)
    with open(out["paths"]["batching"]) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == BATCHING_COLUMNS
    assert {(r["batching"], r["concurrency"]) for r in rows} == {
        (b, c) for b in ("none", f"byte_budget {STRATEGY_BUDGET}", "dynamic") for c in ("1", "4", "16")
    }
    with open(out["paths"]["loadgen"]) as f:
        tools = {r["tool"]: r for r in csv.DictReader(f)}
    assert list(next(iter(tools.values()))) == LOADGEN_COLUMNS
    assert "lab_backends.measure.loadgen http" in tools
    if shutil.which("wrk"):
        assert float(tools["wrk"]["throughput_rps"]) > 0
    with open(out["paths"]["cycle"]) as f:
        cycles = {r["tool"]: r for r in csv.DictReader(f)}
    assert list(next(iter(cycles.values()))) == CYCLE_COLUMNS
    assert set(cycles) == set(tools)  # one cycle row per tool that ran
    for tool, row in cycles.items():
        parts = [float(row[k]) for k in ("model_ms", "backend_ms", "turnaround_ms")]
        assert sum(parts) == pytest.approx(float(row["cycle_ms"]), abs=0.01), tool  # CSV keeps 3 decimals
        # The config above makes full batches of 16: the model's own cost is 10 + 16 * 0.2 ms, and
        # the Python backend's hand-off and the turnaround both take time on a real server.
        batch = float(row["avg_batch"])  # ~16; wrk's connections closing mid-batch can nudge it
        assert 12 < batch < 17, row
        assert float(row["model_ms"]) == pytest.approx(10 + 0.2 * batch, abs=0.01), row
        assert parts[1] > 0 and parts[2] > 0, row
        assert 0 < float(row["server_bound"]) < 1, row
    assert out["paths"]["figure"].stat().st_size > 10_000


def test_tune_the_batcher_forced_re_measures_and_judges_the_second_run(fresh, monkeypatch, capsys):
    """03's checker re-measures a miss once (a p99 bound is absolute); forced here, the second run decides.

    Why forced: the re-measure runs only when a busy machine pushes a correct config over 100 ms (a
    fresh clone's audit beside a one-core hog did), so a fault in it would wait for that day.
    """
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    message = get("tune_the_batcher").checker({"max_batch_size": 16, "dynamic_batching": {}}, fresh)
    out = capsys.readouterr().out
    # Forced when the first round held; a real miss (a busy machine: p99 155 ms beside three other runs) re-measures
    # by itself, over 2x (notebook.measure_rounds, whose paths tests/test_forced_remeasure.py forces).
    assert ("LAB_FORCE_REMEASURE=1: re-measuring once over a 1x window" in out
            or "the machine may be busy: re-measuring once over a 2x window" in out), out
    assert "fast and within the p99 bound" in message
    assert fresh.model_config(MODEL).HasField("dynamic_batching"), "the learner's model is given back as it was"
