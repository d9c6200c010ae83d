"""Batches rebuilt from traces (lab_backends.measure.batches), the batch timeline plot, the probe load
and the scheduler lessons.

Unit tests read a real run recorded from tritonserver 2.51 (tests/data/batches: the trace records
and the answers of 120 requests to ``scheduler_probe`` with 2 and 3 instances); the integration
tests share one live server with tracing on.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from lab_backends.errors import LoadSettingError, TraceError
from lab_backends.lessons import scheduler
from lab_backends.measure import trace as tracing
from lab_backends.measure.batches import batches, compute_spans, overlapping_pairs, timeline_facts
from lab_backends.measure.plots_batches import batch_timeline
from lab_backends.measure.probe_load import probe_load
from lab_backends.measure.stats import entry_when

DATA = Path(__file__).parent / "data" / "batches"
MODEL = scheduler.MODEL


def recorded(instances: int) -> tuple[tracing.TraceLog, pd.DataFrame]:
    records = json.loads((DATA / f"trace_{instances}_instances.json").read_text())
    answers = pd.read_csv(DATA / f"answers_{instances}_instances.csv", keep_default_na=False)
    answers["ok"] = answers["ok"].astype(bool)
    return tracing.TraceLog.from_records(records), answers


# ------------------------------------------------------------------ recorded runs
@pytest.mark.parametrize("instances", [2, 3])
def test_recorded_run_rebuilds_faithful_batches(instances: int) -> None:
    log, answers = recorded(instances)
    table = batches(compute_spans(log, MODEL), answers)
    facts = timeline_facts(table, answers)
    assert facts["instances"] == instances
    assert facts["requests_in_one_batch"] and facts["sizes_agree"]
    assert facts["overlaps_within_instance"] == 0
    assert facts["overlaps_across_instances"] > 0
    assert table["size"].sum() == len(answers) == 120
    assert (table["end_ns"] > table["start_ns"]).all() and table["start_ns"].is_monotonic_increasing
    # one PID per instance, and different instances are different processes
    assert table.groupby("instance")["pid"].nunique().eq(1).all()
    assert table.drop_duplicates("instance")["pid"].nunique() == instances


def test_a_group_naming_two_instances_is_refused() -> None:
    log, answers = recorded(2)
    table = batches(compute_spans(log, MODEL), answers)
    big = table[table["size"] > 1].iloc[0]
    other = next(i for i in table["instance"].unique() if i != big["instance"])
    answers.loc[answers["request_id"] == big["request_ids"][0], "instance"] = other
    with pytest.raises(TraceError, match="cannot be one batch"):
        batches(compute_spans(log, MODEL), answers)


def test_facts_catch_a_lost_request_and_a_wrong_size() -> None:
    log, answers = recorded(2)
    table = batches(compute_spans(log, MODEL), answers)
    assert not timeline_facts(table.iloc[1:], answers)["requests_in_one_batch"]
    wrong = table.copy()
    wrong.loc[0, "model_batch"] += 1
    assert not timeline_facts(wrong, answers)["sizes_agree"]


def test_missing_compute_stamps_raise_a_clear_error() -> None:
    records = json.loads((DATA / "trace_2_instances.json").read_text())
    for record in records:
        record["timestamps"] = [t for t in record.get("timestamps", []) if t["name"] != "COMPUTE_END"]
    with pytest.raises(TraceError, match="COMPUTE_START/COMPUTE_END"):
        compute_spans(tracing.TraceLog.from_records(records), MODEL)


def test_overlapping_pairs_counts_open_intervals() -> None:
    frame = pd.DataFrame({"start_ns": [0, 5, 10, 30], "end_ns": [10, 20, 15, 40]})
    # (0,10)-(5,20), (5,20)-(10,15); touching ends (0,10)-(10,15) do not overlap
    assert overlapping_pairs(frame) == 2
    assert overlapping_pairs(frame.iloc[[0, 3]]) == 0


def test_timeline_plot_has_one_row_per_instance_and_one_bar_per_batch() -> None:
    log, answers = recorded(3)
    table = batches(compute_spans(log, MODEL), answers)
    ax = batch_timeline(table)
    assert [t.get_text() for t in ax.get_yticklabels()] == sorted(table["instance"].unique())
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(table)
    assert batch_timeline(table.iloc[0:0]).get_title().startswith("Batch timeline (no batches)")


def test_probe_load_refuses_bad_settings_before_sending() -> None:
    with pytest.raises(LoadSettingError, match="1..5000"):
        probe_load(None, MODEL, 0)
    with pytest.raises(LoadSettingError, match="one per request"):
        probe_load(None, MODEL, 3, priorities=[1, 2])


def test_outcome_groups_by_message_without_request_ids() -> None:
    answers = pd.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "ok": [True, False, False],
            "done_s": [0.1, 0.01, 0.02],
            "error": [
                "",
                "[StatusCode.UNAVAILABLE] [request id: b] Exceeds maximum queue size",
                "[StatusCode.UNAVAILABLE] [request id: c] Exceeds maximum queue size",
            ],
        }
    )
    table = scheduler.outcome(answers)
    assert table.loc["served", "requests"] == 1
    assert table.loc["[StatusCode.UNAVAILABLE] Exceeds maximum queue size", "requests"] == 2


def test_lanes_place_batches_without_instance_names() -> None:
    from lab_backends.measure.batches import lanes

    log, answers = recorded(2)
    spans = compute_spans(log, MODEL)
    table = lanes(spans)
    named = batches(spans, answers)
    assert len(table) == len(named) and table["size"].sum() == 120
    assert table["instance"].nunique() <= 2
    assert sum(overlapping_pairs(g) for _, g in table.groupby("instance")) == 0


def test_executions_count_each_batch_once() -> None:
    answers = pd.DataFrame({"ok": [True] * 7 + [False], "batch": [4, 4, 4, 4, 1, 2, 2, None]})
    assert scheduler.executions(answers) == {1: 1, 2: 1, 4: 1}


# ------------------------------------------------------------------ a live server
@pytest.fixture(scope="module")
def live():
    from lab_backends.server.triton_server import TritonServer

    server = TritonServer(
        models=[MODEL, scheduler.RAGGED_MODEL, scheduler.GIL_MODEL],
        trace_file=Path(tempfile.mkdtemp(prefix="batches-")) / "trace.json",
        trace_log_frequency=1,
    )
    server.start()
    try:
        yield server, server.model_config(MODEL)
    finally:
        server.stop()


@pytest.mark.server
def test_live_timeline_with_two_instances(live) -> None:
    server, shipped = live
    table, answers, facts = scheduler.batch_timeline(server, shipped, instances=2, n=60, concurrency=12)
    assert answers["ok"].all() and len(answers) == 60
    assert facts["requests_in_one_batch"] and facts["sizes_agree"] and facts["instances"] == 2
    assert facts["overlaps_within_instance"] == 0 and facts["overlaps_across_instances"] > 0
    assert facts["avg_batch"] > 1
    stubs = scheduler.stub_processes(server, answers)
    mine = stubs[stubs["model"] == MODEL]
    assert (mine["program"] == "triton_python_backend_stub").all()
    assert len(mine) == 2 and set(mine["instance (reported)"]) == set(table["instance"])
    assert (mine["instance (command line)"] == mine["instance (reported)"]).all()  # stub_launcher.cc: argv[8]
    assert set(mine["instance (command line)"]) == {f"{MODEL}_0_0", f"{MODEL}_0_1"}
    assert (stubs["model"] == scheduler.RAGGED_MODEL).sum() == 1  # the other model's stub, unreported


@pytest.mark.server
def test_live_queue_policy(live) -> None:
    server, shipped = live
    full = scheduler.queue_full_burst(server, shipped, max_queue_size=4, burst=30)
    assert 0 < full["ok"].sum() < 30
    assert full.loc[~full["ok"], "error"].str.contains("Exceeds maximum queue size").all()
    expired = scheduler.timeout_burst(server, shipped, timeout_ms=100, burst=24, fixed_ms=20)
    assert 0 < expired["ok"].sum() < 24
    assert expired.loc[~expired["ok"], "error"].str.contains("Request timeout expired").all()
    prio = scheduler.priority_burst(server, shipped, burst=16)
    assert prio["ok"].all()
    medians = prio.groupby("priority")["latency_ms"].median()
    assert medians[1] < medians[2]


@pytest.mark.server
def test_live_ragged_batching_mixes_lengths_only_when_allowed(live) -> None:
    server, _ = live
    base = server.model_config(scheduler.RAGGED_MODEL)
    plain = scheduler.ragged_burst(server, base, ragged=False, burst=18)
    ragged = scheduler.ragged_burst(server, base, ragged=True, burst=18)
    for answers in (plain, ragged):
        assert answers["ok"].all() and answers["intact"].all()
        assert sum(size * n for size, n in scheduler.executions(answers).items()) == 18
    assert plain["lengths"].max() == 1
    assert ragged["lengths"].max() > 1 and ragged["batch"].mean() > plain["batch"].mean()


@pytest.mark.server
def test_live_panel_draws_the_batch_timeline(live) -> None:
    from lab_backends.lessons.widgets import BatchingPanel

    server, shipped = live
    scheduler.reload(server, {}, shipped)
    panel = BatchingPanel(server, MODEL, requests=60, duration_s=1.5, concurrency=8)
    # config.pbtxt says `dynamic_batching { }`; Triton fills in [max_batch_size], the panel shows "none"
    assert list(shipped.dynamic_batching.preferred_batch_size) == [shipped.max_batch_size]
    assert panel.preferred.value == ""
    panel.view.value = "batch timeline"
    panel.instances.value = 2
    row = panel.run()
    assert row is not None and row["errors"] == 0, panel.error
    table = panel.last_batches
    assert table is not None, panel.error
    assert 1 <= table["instance"].nunique() <= 2
    assert table["size"].sum() == len(panel.last.requests) + len(panel.last.warmup)
    assert sum(overlapping_pairs(g) for _, g in table.groupby("instance")) == 0
    assert bytes(panel.image.value).startswith(b"\x89PNG")
    drawn = bytes(panel.image.value)
    panel.view.value = "over time"  # toggling redraws the last run without running again
    assert bytes(panel.image.value) != drawn and len(panel.runs) == 1


@pytest.mark.server
def test_live_gil_threads_share_one_core_instances_are_processes(live) -> None:
    server, _ = live
    table = scheduler.gil_compare(server, server.model_config(scheduler.GIL_MODEL), n=16, concurrency=8)
    assert (table["errors"] == 0).all()
    assert table.loc["1 instance, 2 threads", "cores_per_execute"] < 1.1
    assert list(table["stub_processes"]) == [1, 1, 2]
    # From the trace, whatever the free cores: two processes ran execute() at once, one process never did.
    assert table.loc["2 instances, 1 thread", "overlaps_across_processes"] > 0
    assert (table["overlaps_within_process"] == 0).all()
    assert table.loc["1 instance, 2 threads", "overlaps_across_processes"] == 0


@pytest.mark.server
def test_live_reload_warms_every_instance_inside_triton(live) -> None:
    """``reload(warm=2)`` is Triton's model_warmup: 2 executions per instance during the load, none queued.

    The statistics of the freshly loaded model count them before any client request, under a queue
    policy whose 1 ms timeout would expire any client-side warm-up that had to wait.
    """
    from lab_backends.errors import ModelLoadError
    from lab_backends.server.warmup import with_warmup

    server, shipped = live
    policy = {"default_queue_policy": {"default_timeout_microseconds": 1000, "allow_timeout_override": True}}
    scheduler.reload(server, {"instance_group": [{"kind": "KIND_CPU", "count": 3}], "dynamic_batching": policy},
                     shipped, warm=2)
    # Counted as each warm-up request is released: poll (bounded) rather than trust one early read.
    stats = entry_when(server, MODEL, lambda s: int(s["execution_count"]) >= 6)
    assert int(stats["execution_count"]) == 6 and int(stats["inference_stats"]["success"]["count"]) == 6
    bad = with_warmup(shipped, 1)
    bad.model_warmup[0].inputs["INPUT0"].dims[:] = [5]
    with pytest.raises(ModelLoadError, match=r"unexpected shape for input 'INPUT0'.*got \[1,5\]"):
        server.load_model(MODEL, config=bad)
    scheduler.reload(server, {}, shipped)


@pytest.mark.server
def test_live_batch_dimension_error_names_the_expected_shape(live) -> None:
    from tritonclient.utils import InferenceServerException

    from lab_backends.client.infer import infer

    server, shipped = live
    scheduler.reload(server, {}, shipped)
    with pytest.raises(InferenceServerException, match=r"Expected \[-1,4\], got \[4\]"):
        infer(server, MODEL, {"INPUT0": np.ones(4, np.float32)})
    assert infer(server, MODEL, {"INPUT0": np.ones((1, 4), np.float32)})["OUTPUT0"].shape == (1, 4)


def test_stalls_count_only_the_half_second_gaps() -> None:
    # Response times (s) recorded on 2.51: 12-request bursts at one instance, two requests per batch,
    # ~12 ms per batch. Without a queue policy the batches follow each other; with max_queue_size
    # the same burst stalled twice, then four times.
    plain = [0.012, 0.025, 0.025, 0.037, 0.037, 0.048, 0.049, 0.06, 0.061, 0.072, 0.073, 0.084]
    policy = [0.012, 0.525, 0.526, 0.538, 0.538, 0.551, 0.551, 0.562, 0.563, 1.063, 1.064, 1.075]
    worse = [0.017, 0.018, 0.514, 0.514, 0.526, 0.527, 1.027, 1.027, 1.527, 1.528, 2.027, 2.028]
    assert scheduler.stalls(plain) == 0
    assert scheduler.stalls(policy) == 2
    assert scheduler.stalls(list(reversed(worse))) == 4  # order of arrival does not matter
    assert scheduler.stalls([0.0, 0.9]) == 0  # longer than the batcher's wait: something else


@pytest.mark.server
@pytest.mark.upstream
def test_upstream_queue_policy_stalls_the_batcher_half_a_second(live) -> None:
    """Triton 2.51: with a queue policy the batcher sometimes sleeps its 500 ms wait with requests queued.

    A race (see ``scheduler.policy_stalls``), so it is counted over 8 bursts of 6 batches (40 gaps):
    measured here, about a third of the gaps stalled with a policy and none without. Being a race,
    a round of 8 bursts without a stall is re-measured, at most 3 rounds (120 gaps) in all, before
    the pin says the defect is gone. 03b's queue-policy note explains it to learners. When this
    fails, an upgrade fixed it: drop the note and this test.
    """
    server, shipped = live
    plain = scheduler.policy_stalls(server, shipped, {})
    assert (plain["served"] == 12).all()
    rounds = []
    for _ in range(3):
        policy = scheduler.policy_stalls(server, shipped, {"default_queue_policy": {"max_queue_size": 100}})
        assert (policy["served"] == 12).all()
        rounds.append(int(policy["stalls"].sum()))
        if rounds[-1] >= 1:
            break
    assert rounds[-1] >= 1, (
        f"no ~0.5 s batcher stall in {len(rounds)} rounds of {len(policy)} bursts with a queue policy "
        f"(last spans {policy['span_ms'].tolist()} ms; on 2.51 about a third of the gaps stalled): "
        "the upstream race seems fixed; update 03b's note and drop this test")
    assert plain["stalls"].sum() < rounds[-1] or plain["stalls"].sum() == 0, (
        f"without a policy the batcher stalled as often ({plain['stalls'].sum()}) as with one: machine too busy?")
