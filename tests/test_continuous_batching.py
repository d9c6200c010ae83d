"""Continuous (iterative) vs static batching, proved from the models' own records (notebook 08b).

``generate_iterative`` (``sequence_batching { iterative_sequence: true }``, one step per execution,
RESCHEDULE until done) and ``generate_static`` (a whole batch in one execution) stream one token
per response, each with the model's record of its step: EXEC, STEP, BATCH (and NULLS). Arrivals are
arranged by those records (a short request is sent once the long one has received 2 tokens), so
the evidence does not depend on timing luck; every wait is bounded (``run_streams``' timeout).
The server's own trace says the same: a rescheduled request keeps one trace with one QUEUE_START and
one COMPUTE_START/END per step, stamped like the other requests of the same execution.
The server's statistics count one success per step and one failure per generation (the sequencer's
END marker); a generation cancelled by its client frees its sequence slot at once, not after the
idle reaper's 5 s (``continuous_release.cancel_frees_slot``).
"""

from __future__ import annotations

import pytest

from lab_backends.charlm import build_charlm
from lab_backends.cli import build_parser
from lab_backends.lessons.continuous import late_arrival, served_as_computed, server_view
from lab_backends.lessons.continuous_release import cancel_frees_slot, iterative_statistics
from lab_backends.measure import generation_bench
from lab_backends.measure.generation import ITERATIVE, LENGTHS, STATIC, Ask, GenerationRun, closed_loop, run_streams
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    build_charlm()  # set-up built it; cheap when fresh, and a checkout without it gets it here
    with TritonServer(models=[STATIC, ITERATIVE], target="local", startup_timeout_s=180,
                      trace_file=tmp_path_factory.mktemp("trace") / "trace.json", trace_log_frequency=1) as srv:
        yield srv


#: The long request's tokens in the late-arrival tests: 120, where the notebook shows 40. The short one is sent
#: when the client sees the long one's 2nd token, and must join before the long one ends: with 40 the client had
#: ~38 steps of ~6.5 ms (~250 ms) to react, and a client held off the CPU that long missed (simulated here with
#: a thread hogging the GIL in 100 / 150 ms slices: 1 / 3 of 3 runs had the short one run after the long one
#: ended). With 120 it has ~770 ms: 0 of 6 at the same slices, the short one joining by the 92nd step at worst.
LONG_TOKENS = 120


def test_iterative_admits_a_new_request_while_an_older_one_is_generating(server):
    seen = late_arrival(server, ITERATIVE, long_tokens=LONG_TOKENS, short_tokens=4, after=2, tag="iterative")
    long, short = seen.run[seen.long], seen.run[seen.short]
    assert seen.run.complete, seen.run.requests()
    # One step per execution: the long request's tokens came from as many consecutive executions.
    assert long.executions == list(range(long.executions[0], long.executions[0] + LONG_TOKENS))
    # The short one was admitted between two of them and ran all its 4 steps beside the long one ...
    assert seen.joined_while_generating, seen.summary()
    assert min(short.executions) > long.executions[1]  # sent after the long one's 2nd token
    assert {t.batch for t in short.tokens} == {2}
    # ... and left before it: the long one's later steps ran alone again.
    assert long.tokens[-1].batch == 1 and max(short.executions) < max(long.executions)
    assert served_as_computed(seen.run)
    # The server's trace: 120 and 4 computes, each of the short one's stamped like one of the long one's.
    traced = server_view(seen, server.trace_file)
    assert (traced.computes(seen.long), traced.computes(seen.short)) == (LONG_TOKENS, 4), traced.steps
    assert traced.short_in_long_computes == 4, traced.steps


def test_static_makes_a_late_request_wait_for_the_whole_batch(server):
    seen = late_arrival(server, STATIC, long_tokens=40, short_tokens=4, after=2, tag="static")
    long, short = seen.run[seen.long], seen.run[seen.short]
    assert seen.run.complete, seen.run.requests()
    assert len(set(long.executions)) == 1  # all 40 steps in ONE execution
    assert seen.waited_for_whole_batch, seen.summary()
    assert not seen.shared and {t.batch for t in short.tokens} == {1}
    assert served_as_computed(seen.run)
    # The server's trace: one compute each, the short one's starting after the long one's ended.
    traced = server_view(seen, server.trace_file)
    assert (traced.computes(seen.long), traced.computes(seen.short)) == (1, 1), traced.steps
    assert traced.short_started_after_long_ended and traced.short_in_long_computes == 0, traced.steps


def test_mixed_lengths_each_stream_gets_its_tokens_in_order_then_one_final(server):
    for model in (STATIC, ITERATIVE):
        run = run_streams(server, model, closed_loop(streams=4, rounds=2), timeout_s=60)
        assert run.complete, (model, run.requests())
        assert served_as_computed(run), model
        assert max(run.timeline()["batch"]) > 1, model  # requests did share executions


def test_iterative_skips_the_null_requests_of_a_freed_slot(server):
    """``direct`` fills an empty slot below a busy one with a null request (READY 0): the model skips it."""
    # first: 30 tokens, so second (sent once first has one) arrives while first has ~29 steps (~0.2 s) to go,
    # a margin that survives a machine many times slower; second outlives it by 30 more steps.
    run = run_streams(server, ITERATIVE, [[Ask("first", 30)], [Ask("second", 60, after=("first", 1))]])
    assert run.complete and served_as_computed(run)
    first, second = run["first"], run["second"]
    assert min(second.executions) < max(first.executions), "second did not join while first ran"
    after_first = [t for t in second.tokens if t.execution > max(first.executions)]
    assert after_first and {t.batch for t in after_first} == {1}
    # Slot 0 (first's) emptied while slot 1 (second's) was busy: those executions carried a null request.
    assert {t.nulls for t in after_first} == {1}


def test_a_refused_request_ends_its_stream_and_frees_its_slot(server):
    run = run_streams(server, ITERATIVE, [[Ask("bad", 0), Ask("good", 3)]])
    assert "MAX_TOKENS must be between 1 and" in run["bad"].error
    assert run["good"].complete and served_as_computed(GenerationRun(ITERATIVE, [run["good"]], run.wall_s))


def test_statistics_count_every_step_and_one_end_marker(server):
    """20 tokens alone (~0.3 s): 20 successes (one per step), inference_count +20, and one failure, the
    sequencer's cancelled END request; each step's request duration runs from the request's start,
    so their sum is at least the paced steps' 6.5 ms x (1 + 2 + ... + 20)."""
    stats = iterative_statistics(server, ITERATIVE, tokens=20)
    assert (stats.successes, stats.inference_count, stats.failures) == (20, 20, 1), stats.summary()
    assert stats.request_s >= stats.request_floor_s, stats.summary()
    assert stats.request_s > 3 * stats.latency_s, stats.summary()  # ~10x measured: the sum is no latency


def test_a_cancelled_generation_frees_its_slot_at_once(server):
    """All 8 slots busy and a 9th request waiting; one generation is cancelled by its client (~1.5 s).
    The model hands it back with RESCHEDULE, so the batcher frees its slot at once: the waiting request
    starts while the 7 others still generate (they have ~95 steps left). Released with ALL, the slot
    waits for the idle reaper (5.05 s measured on the C twin, test_continuous_batching_c.py), against
    0.02-0.07 s now."""
    seen = cancel_frees_slot(server, ITERATIVE, held_tokens=100, tag="py")
    assert seen.admitted_while_held, seen.summary()
    assert seen.cancel_to_first_token_s < 2.5, seen.summary()  # half the reaper's 5 s
    assert all(seen.run[h].complete for h in seen.held) and seen.run[seen.waiting].complete, seen.run.requests()


def test_the_bench_table_compares_both_models_side_by_side(server, tmp_path):
    """``lab-backends bench continuous`` prints and writes this table (its own server; here a short loop on ours)."""
    runs = generation_bench.compare(server, streams=8, rounds=1)
    frame = generation_bench.table(runs)
    assert list(frame.columns) == generation_bench.COLUMNS
    assert list(frame["model"]) == [STATIC, ITERATIVE, "iterative / static"]
    assert frame["complete"].iloc[:2].tolist() == [True, True]
    assert frame["tokens"].iloc[0] == frame["tokens"].iloc[1] == sum(LENGTHS)
    # One step per execution: the iterative model's forward passes are its executions.
    assert frame["forward_passes"].iloc[1] == frame["executions"].iloc[1]
    assert build_parser().parse_args(["bench", "continuous"]).name == "continuous"
