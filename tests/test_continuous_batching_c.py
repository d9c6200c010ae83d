"""generate_iterative_c: continuous batching in a C backend (``c_backends/lab_iterative``), beside generate_iterative.

The C backend runs the same character model as the Python one, one step per execution, and
releases unfinished requests with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``. One server serves
both models; every comparison is within one run. Arrivals are arranged by the models' own records
(``late_arrival``), never by sleeps; every wait is bounded.

Why equal tokens are expected, not just close ones: numpy sums the network's float32 products in
float32 (its BLAS's order), the C backend in double, so their scores differ by rounding only. A
greedy token could differ only where the two best scores are closer than that rounding; the first
test measures both on this test's prompts (the gap in float64, the rounding as float32 against
float64 scores) and requires a wide margin, so the token comparison is not luck.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from lab_backends.charlm import ARTIFACT, build_charlm, load_weights
from lab_backends.charlm.build import RAW_PLACEMENTS
from lab_backends.charlm.net import Weights, context_ids
from lab_backends.charlm.raw import ORDER, from_bytes, to_bytes
from lab_backends.client.infer import make_inputs
from lab_backends.errors import ModelLoadError
from lab_backends.lessons.continuous import late_arrival, served_as_computed, server_view
from lab_backends.lessons.continuous_release import cancel_frees_slot, iterative_statistics
from lab_backends.measure.generation import DEFAULT_PROMPT, ITERATIVE, Ask, GenerationRun, closed_loop, run_streams
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import cbackend
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll, settled

ITERATIVE_C = "generate_iterative_c"
NO_READY = "generate_iterative_c_no_ready"  # its config without the READY control input
SOURCE = cbackend.C_BACKENDS_DIR / "lab_iterative" / "lab_iterative.c"
#: Prompts and lengths: a line of the Zen, a fragment, characters the model never saw (non-ASCII
#: included: the backend counts UTF-8 characters as Python does), nothing at all.
PROMPTS = ((DEFAULT_PROMPT, 40), ("Errors should", 17), ("x" * 40, 9), ("", 33),
           ("na\u00efve \u2603 prompt: Special", 25), ("Now is better than never.\n", 64))


def _scores(weights: Weights, text: str, dtype) -> np.ndarray:
    """The network's scores for the next character of ``text``, computed in ``dtype``."""
    w = {k: getattr(weights, k).astype(dtype) for k in ORDER}
    x = w["emb"][context_ids(weights, text)].reshape(1, -1)
    h = np.maximum(x @ w["w1"] + w["b1"], 0)
    h = np.maximum(h @ w["w2"] + w["b2"], 0)
    return (h @ w["w3"] + w["b3"])[0]


def test_greedy_decoding_has_room_for_rounding_on_these_prompts() -> None:
    """Along every prompt's generation the two best scores lie far further apart than float32 rounding moves them."""
    build_charlm()
    weights = load_weights(ARTIFACT)
    gaps, rounding = [], []
    for prompt, n in PROMPTS:
        text = prompt
        for _ in range(n):
            exact, single = _scores(weights, text, np.float64), _scores(weights, text, np.float32)
            top = np.sort(exact)[-2:]
            gaps.append(top[1] - top[0])
            rounding.append(np.abs(exact - single).max())
            text += weights.vocab[int(np.argmax(exact))]
    assert min(gaps) > 20 * max(rounding), (min(gaps), max(rounding))


def test_the_raw_weights_are_the_trained_ones() -> None:
    build_charlm()  # exports charlm.raw beside the C model when missing or stale
    weights = load_weights(ARTIFACT)
    (raw,) = RAW_PLACEMENTS
    data = raw.read_bytes()
    assert data == to_bytes(weights)
    back = from_bytes(data)
    assert back.vocab == weights.vocab
    assert all(np.array_equal(getattr(back, k), getattr(weights, k)) for k in ORDER)


def test_the_c_model_is_configured_like_generate_iterative() -> None:
    python, c = read_config(MODEL_REPOSITORY / ITERATIVE), read_config(MODEL_REPOSITORY / ITERATIVE_C)
    assert (python.backend, c.backend) == ("python", "lab_iterative")
    c.name, c.backend = python.name, python.backend
    assert c == python  # same tensors, sequence_batching { iterative_sequence }, decoupled, cost parameters


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    build_charlm()  # set-up did both; cheap when fresh
    if cbackend.is_stale("lab_iterative", SOURCE):
        cbackend.build(SOURCE, "lab_iterative")
    variants = tmp_path_factory.mktemp("variants")  # NO_READY: loaded by its test only
    config = read_config(MODEL_REPOSITORY / ITERATIVE_C)
    config.name = NO_READY
    del config.sequence_batching.control_input[:]
    (variants / NO_READY / "1").mkdir(parents=True)
    (variants / NO_READY / "config.pbtxt").write_text(config_text(config))
    with TritonServer([MODEL_REPOSITORY, variants], models=[ITERATIVE, ITERATIVE_C], target="local",
                      startup_timeout_s=180, trace_file=tmp_path_factory.mktemp("trace") / "trace.json",
                      trace_log_frequency=1) as srv:
        yield srv


@pytest.mark.server
def test_the_c_model_streams_the_python_models_tokens(server) -> None:
    streams = [[Ask(f"p{i}", n, prompt=prompt)] for i, (prompt, n) in enumerate(PROMPTS)]
    runs = {model: run_streams(server, model, streams, timeout_s=60) for model in (ITERATIVE, ITERATIVE_C)}
    for model, run in runs.items():
        assert run.complete, (model, run.requests())
        assert max(run.timeline()["batch"]) > 1, model  # the prompts shared executions
    assert {g.ask.name: g.text for g in runs[ITERATIVE_C].generations} == \
        {g.ask.name: g.text for g in runs[ITERATIVE].generations}
    assert served_as_computed(runs[ITERATIVE_C])  # and both are what numpy computes in-process


#: The long request's tokens in the late-arrival test: 120, not the notebook's 40 (why: the same constant in
#: tests/test_continuous_batching.py). The short one is sent when the client sees the long one's 2nd token and must
#: join before the long one ends: ~250 ms of steps with 40, ~770 ms with 120, for a client held off the CPU.
LONG_TOKENS = 120


@pytest.mark.server
def test_a_late_request_joins_the_c_models_executions(server) -> None:
    seen = late_arrival(server, ITERATIVE_C, long_tokens=LONG_TOKENS, short_tokens=4, after=2, tag="c")
    long, short = seen.run[seen.long], seen.run[seen.short]
    assert seen.run.complete, seen.run.requests()
    assert long.executions == list(range(long.executions[0], long.executions[0] + LONG_TOKENS))  # one step each
    assert seen.joined_while_generating, seen.summary()
    assert min(short.executions) > long.executions[1] and {t.batch for t in short.tokens} == {2}
    assert long.tokens[-1].batch == 1 and max(short.executions) < max(long.executions)
    assert served_as_computed(seen.run)
    # The server's trace, stamped by the backend's statistics: 120 and 4 computes, the short one's
    # four with the very COMPUTE_START of one of the long one's (the same execution).
    traced = server_view(seen, server.trace_file)
    assert (traced.computes(seen.long), traced.computes(seen.short)) == (LONG_TOKENS, 4), traced.steps
    assert traced.short_in_long_computes == 4, traced.steps


@pytest.mark.server
def test_every_stream_gets_exactly_its_tokens_then_one_final(server) -> None:
    run = run_streams(server, ITERATIVE_C, closed_loop(streams=4, rounds=2), timeout_s=60)
    assert run.complete, run.requests()  # steps 0..n-1 in order, one FINAL on the last, nothing after
    assert served_as_computed(run)
    assert max(run.timeline()["batch"]) > 1


@pytest.mark.server
def test_the_c_model_skips_the_null_request_of_a_freed_slot(server) -> None:
    # first: 30 tokens, so second (sent once first has one) arrives while first has ~29 steps (~0.2 s) to go,
    # a margin that survives a machine many times slower; second outlives it by 30 more steps.
    run = run_streams(server, ITERATIVE_C, [[Ask("first", 30)], [Ask("second", 60, after=("first", 1))]])
    assert run.complete and served_as_computed(run)
    assert min(run["second"].executions) < max(run["first"].executions), "second did not join while first ran"
    after_first = [t for t in run["second"].tokens if t.execution > max(run["first"].executions)]
    assert after_first and {t.batch for t in after_first} == {1} and {t.nulls for t in after_first} == {1}


@pytest.mark.server
def test_a_refused_request_ends_its_stream_and_frees_its_slot(server) -> None:
    run = run_streams(server, ITERATIVE_C, [[Ask("bad", 0), Ask("good", 3)]])
    assert "MAX_TOKENS must be between 1 and 256, got 0" in run["bad"].error
    assert run["good"].complete and served_as_computed(GenerationRun(ITERATIVE_C, [run["good"]], run.wall_s))


@pytest.mark.server
def test_a_prompt_that_is_not_utf8_is_refused_with_the_reason(server) -> None:
    """generate_iterative would decode it with replacement characters; the C backend names the bad byte."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error))
    try:
        inputs = {"PROMPT": np.array([[b"ab\xffcd"]], dtype=object), "MAX_TOKENS": np.array([[3]], dtype=np.int32)}
        client.async_stream_infer(ITERATIVE_C, make_inputs(inputs), request_id="not-utf8",
                                  enable_empty_final_response=True)
        error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None and "PROMPT is not valid UTF-8 (byte 2)" in str(error), error


def _model_stats(server) -> dict:
    return server.statistics(ITERATIVE_C)["model_stats"][0]


def _successes_and_executions(stats: dict) -> tuple[int, int]:
    return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])


@pytest.mark.server
def test_statistics_count_every_step_with_the_time_it_took(server) -> None:
    """ReportStatistics once per request per step, timed with CLOCK_MONOTONIC around the paced step."""
    # An earlier test's last step may still be reporting (see below): read once the counts stay put.
    before = settled(lambda: _model_stats(server), _successes_and_executions, quiet_s=0.2)
    run = run_streams(server, ITERATIVE_C, [[Ask("a", 12)], [Ask("b", 5, after=("a", 2))]])
    assert run.complete
    steps = run.timeline()
    # lab_iterative.c sends a step's token (the last one FINAL) before it reports the step's statistics
    # (release(), then ReportBatchStatistics): the client can hold its FINAL first. Wait for the records' totals.
    grown = (len(steps), steps["execution"].nunique())
    b = _successes_and_executions(before)
    after = poll(lambda: _model_stats(server),
                 lambda now: all(n - m >= g for n, m, g in zip(_successes_and_executions(now), b, grown)), 10, 0.02)
    success = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    assert success == len(steps) == 17  # one per token: a rescheduled request is counted at every step
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions == steps["execution"].nunique()
    # Each step sleeps until step_ms + per_sequence_ms * B after its forward pass began (6 + 0.5 B ms):
    # the compute time the server recorded per request-step cannot be shorter.
    stats_after, stats_before = after["inference_stats"], before["inference_stats"]
    infer_ns = int(stats_after["compute_infer"]["ns"]) - int(stats_before["compute_infer"]["ns"])
    assert infer_ns / success >= 6.5e6, infer_ns / success
    batches = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert {1, 2} <= batches, after["batch_stats"]


@pytest.mark.server
def test_statistics_count_one_end_marker_per_generation_and_durations_from_the_start(server) -> None:
    """One failure per generation: the sequencer's cancelled END request (sequence_utils.cc L44-50),
    counted although null requests collect no other statistics; each step's request duration runs
    from the request's original start. ~0.3 s."""
    stats = iterative_statistics(server, ITERATIVE_C, tokens=20)
    assert (stats.successes, stats.inference_count, stats.failures) == (20, 20, 1), stats.summary()
    assert stats.request_s >= stats.request_floor_s, stats.summary()


@pytest.mark.server
def test_a_cancelled_generation_frees_its_slot_at_once(server) -> None:
    """All 8 slots busy, a 9th request waiting, one generation cancelled by its client (~1.5 s): the
    backend reschedules it, the batcher frees the slot, the waiting request starts while the 7 others
    still generate. With the old release (FINAL, then ALL) it waited for the 5 s idle reaper (5.05 s
    measured, against 0.02-0.07 s now)."""
    seen = cancel_frees_slot(server, ITERATIVE_C, held_tokens=100, tag="c")
    assert seen.admitted_while_held, seen.summary()
    assert seen.cancel_to_first_token_s < 2.5, seen.summary()  # half the reaper's 5 s
    assert all(seen.run[h].complete for h in seen.held) and seen.run[seen.waiting].complete, seen.run.requests()


@pytest.mark.server
def test_a_config_without_the_ready_control_is_refused_at_load(server) -> None:
    """``direct`` fills empty slots with null requests whether or not READY is configured (core
    sequence_batch_scheduler.cc L1745-1767; READY is optional, L637-644): without it a null request
    cannot be told from a real one, so the backend refuses such a config at load, naming the fix.
    A model of its own (a failed RE-load of generate_iterative_c, with a config override, left a
    model live that kept the server's shutdown waiting its full 5 s exit timeout). ~0.5 s."""
    with pytest.raises(ModelLoadError) as caught:
        server.load_model(NO_READY)
    assert "needs a control input named READY" in caught.value.reason, caught.value.reason
    assert "CONTROL_SEQUENCE_READY" in caught.value.reason, caught.value.reason
