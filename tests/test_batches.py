"""Batches rebuilt from traces (lab_backends.measure.batches), the batch timeline plot, the probe load
and the scheduler lessons.

Unit tests read a real run recorded from tritonserver 2.51 (tests/data/batches: the trace records
and the answers of 120 requests to ``scheduler_probe`` with 2 and 3 instances); the integration
tests share one live server with tracing on.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from lab_backends.errors import LoadSettingError, TraceError
from lab_backends.lessons import batcher_stall, queue_policy_lesson, scheduler
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
def test_live_queue_policy_bursts_show_the_policy_not_the_stall(live) -> None:
    """The three bursts of 03b section 2, on the evidence the notebook checks (counts, trace stamps)."""
    server, shipped = live
    full = queue_policy_lesson.queue_full_burst(server, shipped, max_queue_size=4, burst=30)
    refused = full.failed_with(queue_policy_lesson.FULL)
    assert 0 < full.served < 30 and len(refused) == 30 - full.served
    assert full.counted_success == full.served and full.counted_fail == full.pings.expired  # refusals: uncounted
    expired = queue_policy_lesson.timeout_burst(server, shipped, timeout_ms=100, burst=24, fixed_ms=40)
    late = expired.failed_with(queue_policy_lesson.EXPIRED)
    assert 0 < expired.served < 24 and len(late) == 24 - expired.served
    assert expired.counted_fail == len(late) + expired.pings.expired
    assert expired.expired_queue_ms.min() >= 100 and len(expired.expired_queue_ms) == len(late)
    prio = queue_policy_lesson.priority_burst(server, shipped, burst=16, fixed_ms=200)
    order = queue_policy_lesson.priority_order(prio)
    assert prio.answers["ok"].all() and order["queued_before_first_end"] and order["passed_over"] == 0
    medians = queue_policy_lesson.latency_by_priority(prio)["50%"]
    assert medians[1] < medians[2]
    for run in (full, expired, prio):  # the pings kept the batcher awake, and none of them ran
        assert run.pings.sent > 0 and run.pings.expired == run.pings.sent and not run.pings.other
        assert run.longest_idle_ms < batcher_stall.STALL_IDLE_MS  # no stall: half the batcher's 500 ms wait


@pytest.mark.server
def test_a_slow_client_still_fills_the_queue_and_gets_refusals(live, monkeypatch) -> None:
    """Each send of the burst 5 ms late (2x the slowest client seen in make test): the queue still fills while
    a batch runs, so the excess is refused. With 10 ms batches the server drained it as fast: none refused."""
    server, shipped = live
    send = server.grpc_client.async_infer

    def late(*args, **kwargs):
        time.sleep(0.005)
        return send(*args, **kwargs)

    monkeypatch.setattr(server.grpc_client, "async_infer", late)
    full = queue_policy_lesson.queue_full_burst(server, shipped, max_queue_size=4, burst=30)
    refused = full.failed_with(queue_policy_lesson.FULL)
    assert 0 < full.served < 30 and len(refused) == 30 - full.served, full.answers[["ok", "error", "sent_s"]]


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
    # 12 in flight, more than one batch holds (max_batch_size 8): a wave of requests cannot all go to one
    # instance, so the second is busy while the first is. With 8 in flight a busy machine's client sent
    # them as one wave, one batch of 8 at a time, and the two instances never overlapped (seen once).
    table = scheduler.gil_compare(server, server.model_config(scheduler.GIL_MODEL), n=24, concurrency=12)
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


def _spans(batches_ms: list[tuple[float, float, list[float]]]) -> pd.DataFrame:
    """Trace spans from (start_ms, end_ms, [queue_ms of each request of that batch])."""
    rows = [{"request_id": f"r{b}-{i}", "queue_ns": int(q * 1e6), "start_ns": int(start * 1e6),
             "end_ns": int(end * 1e6)}
            for b, (start, end, queued) in enumerate(batches_ms) for i, q in enumerate(queued)]
    return pd.DataFrame(rows, columns=["request_id", "queue_ns", "start_ns", "end_ns"])


def test_idle_gaps_count_only_gaps_with_a_request_waiting() -> None:
    # A burst at one instance (shape of a 2.51 run): the third batch's requests were queued at 1 ms,
    # but it started 500 ms after the second began; the fourth's request arrived during the gap.
    spans = _spans([(0, 12, [0]), (12.5, 24, [0.5, 1]), (512.5, 524, [1, 1]), (600, 610, [590])])
    gaps = batcher_stall.idle_gaps(spans)
    assert len(gaps) == 2  # 12->12.5 and 24->512.5 (requests waited); 524->600 does not count: nothing waited
    stall = gaps[gaps["stall"]].iloc[0]
    assert stall["idle_ms"] == pytest.approx(488.5) and stall["since_batch_start_ms"] == pytest.approx(500)
    assert gaps["stall"].sum() == 1 and stall["at_ms"] == pytest.approx(24)
    # Two instances overlapping: no gap while one of them runs.
    assert batcher_stall.idle_gaps(_spans([(0, 20, [0]), (5, 30, [1]), (31, 40, [2])]))["idle_ms"].tolist() == \
        pytest.approx([1.0])
    assert batcher_stall.idle_gaps(_spans([])).empty


def test_the_ping_level_is_below_the_real_ones_and_expires_at_once() -> None:
    plain, level = batcher_stall.with_ping_level({"default_queue_policy": {"max_queue_size": 4}})
    assert level == 2 and plain["priority_levels"] == 2 and plain["default_priority_level"] == 1
    assert plain["priority_queue_policy"] == {"2": {"default_timeout_microseconds": batcher_stall.PING_TIMEOUT_US}}
    assert plain["default_queue_policy"] == {"max_queue_size": 4}  # the real requests' level keeps it
    levels, level = batcher_stall.with_ping_level({"priority_levels": 2, "default_priority_level": 2})
    assert level == 3 and levels["priority_levels"] == 3 and levels["default_priority_level"] == 2


@pytest.mark.server
def test_live_stall_report_remeasures_when_forced(live, monkeypatch) -> None:
    """The re-measure branch of ``stall_report`` (taken when a round shows no stall), forced."""
    server, shipped = live
    monkeypatch.setenv("LAB_FORCE_REMEASURE", "1")
    report = batcher_stall.stall_report(server, shipped, bursts=2, burst=6, rounds=2)
    assert report.rounds == 2 and report.table.loc[batcher_stall.STALLING, "bursts"] == 4
    assert list(report.table.index) == list(batcher_stall.CONFIGS)
    pinged = report.table.loc["1 instance, max_queue_size 100, pings"]
    assert pinged["stalls"] == 0 and pinged["pings"] == pinged["pings_expired"] > 0


@pytest.mark.server
@pytest.mark.upstream
def test_upstream_queue_policy_stalls_the_batcher_half_a_second(live) -> None:
    """Triton 2.51: with a queue policy the batcher sometimes sleeps its 500 ms wait with requests queued.

    A race (see ``lessons/batcher_stall.py``), counted from the trace over 8 bursts of 6 batches at one
    instance: measured here, about half of the gaps between batches stalled with a policy, none without
    one. Being a race, a round without a stall is re-measured, at most 3 rounds in all, before the pin
    says the defect is gone. Each stall ends about 500 ms after the previous batch started (the
    batcher's ``default_wait_microseconds``). 03b section 3 explains it to learners. When this fails,
    an upgrade fixed it: drop that section, the pings of section 2 and this test.
    """
    server, shipped = live
    plain, _ = batcher_stall.measure(server, shipped, 1, {})
    assert (plain["served"] == 12).all()
    rounds, gaps = [], None
    for _ in range(3):
        policy, gaps = batcher_stall.measure(server, shipped, 1, batcher_stall.POLICY)
        assert (policy["served"] == 12).all()
        rounds.append(int(policy["stalls"].sum()))
        if rounds[-1] >= 1:
            break
    assert rounds[-1] >= 1, (
        f"no ~0.5 s batcher stall in {len(rounds)} rounds of {len(policy)} bursts with a queue policy "
        f"(last spans {policy['span_ms'].round(0).tolist()} ms; on 2.51 about half of the gaps stalled): "
        "the upstream race seems fixed; update 03b and drop this test")
    assert gaps.loc[gaps["stall"], "since_batch_start_ms"].between(450, 650).all()
    assert plain["stalls"].sum() == 0, f"without a policy the batcher stalled {plain['stalls'].sum()} times"
