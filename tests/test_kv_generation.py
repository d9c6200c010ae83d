"""generate_kv on a real server: kvlm with a paged KV cache in a Python backend's stub (issue 48).

One server serves ``generate_kv`` (512 blocks of 16 tokens: room for 32 sequences of 256) and a small-pool
copy, ``generate_kv_small`` (14 blocks of 16 tokens, step_ms 10: every step lasts at least 10 ms, so that
requests sent one by one are all in flight before the first one finishes, whatever the machine's load).
Every check reads the tokens and the model's own records (STEP, KIND, BATCH, BLOCKS, FREE_BLOCKS), none a
timing:

* 32 concurrent prompts of 1-100 characters, 256 positions at most each: every token equals the reference
  decoder's (greedy, no cache, ``lab_backends.kvlm.reference``), whose smallest top-2 logit gap is shown
  first to be far above float rounding; the first token comes from a prefill, the others from decodes;
  a sequence holds ceil(cached / 16) blocks after each step, none after its last, and the pool is whole
  again afterwards;
* under the small pool some sequences wait (fewer run at once than were sent), none fails, and every
  token is still the reference's (preempted sequences included: 21 re-prefills in one run here);
* a cancelled generation gives its blocks back; a request that could never fit, or runs past 256
  positions, is refused in one line.
"""

from __future__ import annotations

import shutil
import time

import pytest

from lab_backends.charlm.text import zen
from lab_backends.kvlm import PLACEMENTS, build_kvlm, reference
from lab_backends.measure.kv_streams import KvAsk, stream_kv
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.repository import config_text, read_config
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

MODEL, SMALL = "generate_kv", "generate_kv_small"
KV_BLOCKS, BLOCK_TOKENS, SMALL_BLOCKS = 512, 16, 14


def mixed_asks(n: int = 32) -> list[KvAsk]:
    """``n`` prompts cut from the Zen at different places, 1-100 characters, with 5-240 tokens to generate:
    block boundaries (15, 16, 17, 32 cached tokens) and the full 256 positions among them."""
    text = zen() * 2
    asks = []
    for i in range(n):
        chars = (1, 15, 16, 17, 32, 100, 7, 60)[i % 8] if i < 8 else 1 + (i * 37) % 100
        tokens = min(256 - chars, (240, 241, 240, 239, 224, 156, 5, 40)[i % 8] if i < 8 else 8 + (i * 53) % 120)
        start = (i * 97) % len(zen())
        asks.append(KvAsk(f"s{i}", text[start:start + chars], tokens))
    return asks


def held_after(prompt: int, step: int) -> int:
    """Blocks a sequence holds after step ``step``: its prompt and ``step`` generated tokens are cached."""
    return -(-(prompt + step) // BLOCK_TOKENS)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    build_kvlm()  # set-up trained it; cheap when fresh
    variants = tmp_path_factory.mktemp("variants")
    config = read_config(MODEL_REPOSITORY / MODEL)
    config.name = SMALL
    config.parameters["kv_blocks"].string_value = str(SMALL_BLOCKS)
    config.parameters["step_ms"].string_value = "10"
    shutil.copytree(MODEL_REPOSITORY / MODEL / "1", variants / SMALL / "1",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (variants / SMALL / "config.pbtxt").write_text(config_text(config))
    with TritonServer([MODEL_REPOSITORY, variants], models=[MODEL, SMALL], target="local",
                      startup_timeout_s=180) as srv:
        yield srv


@pytest.fixture(scope="module")
def expected():
    """The reference decoder's text and margins for every prompt (seconds: no cache, by design)."""
    model = reference.load(PLACEMENTS[0])
    return {a.name: reference.decode(model, a.prompt, a.max_tokens) for a in mixed_asks()}


def probe(server, model: str) -> list:
    """A 2-token generation of a 9-character prompt on an idle model: its records say what the pool holds."""
    run = stream_kv(server, model, [KvAsk("probe", "Beautiful", 2)], timeout_s=60)
    assert run.complete, (run.errors, run["probe"].tokens)
    return run["probe"].tokens


def wrong_tokens(run, expected) -> dict:
    return {g.ask.name: (g.text, expected[g.ask.name].text) for g in run.generations
            if g.text != expected[g.ask.name].text}


def test_the_prompts_are_mixed_and_no_reference_token_is_a_near_tie(expected) -> None:
    asks = mixed_asks()
    assert len(asks) == 32 and min(len(a.prompt) for a in asks) == 1 and max(len(a.prompt) for a in asks) == 100
    assert max(len(a.prompt) + a.max_tokens for a in asks) == 256
    # Served tokens come out of a different float order (batched, cached, paged): a gap this wide cannot flip.
    assert min(min(d.margins) for d in expected.values()) > 0.05


def test_every_token_is_the_reference_decoders(server, expected) -> None:
    run = stream_kv(server, MODEL, mixed_asks(), timeout_s=180)
    assert run.complete, (run.errors, [(g.ask.name, g.error, len(g.tokens)) for g in run.generations])
    assert not wrong_tokens(run, expected), wrong_tokens(run, expected)
    assert run.max_batch() > 1  # sequences shared executions
    for g in run.generations:
        assert [t.kind for t in g.tokens] == ["prefill"] + ["decode"] * (g.ask.max_tokens - 1), g.ask.name
        assert [t.blocks for t in g.tokens[:-1]] == [held_after(len(g.ask.prompt), t.step) for t in g.tokens[:-1]]
        assert g.tokens[-1].blocks == 0  # freed with the last token
    # The pool is whole again: the probe's prefill holds its 9 characters' block, its last step gives it back.
    assert [(t.blocks, t.free_blocks) for t in probe(server, MODEL)] == [(1, KV_BLOCKS - 1), (0, KV_BLOCKS)]


def test_a_small_pool_makes_sequences_wait_not_fail(server, expected) -> None:
    asks = mixed_asks()[8:]  # 24 sequences of 3-14 blocks each, against a pool of 14
    run = stream_kv(server, SMALL, asks, timeout_s=240)
    assert run.complete, (run.errors, [(g.ask.name, g.error, len(g.tokens)) for g in run.generations])
    # Precondition of "at once": every request was sent before the first one finished (>= 8 steps of 10 ms).
    assert max(g.sent_s for g in run.generations) < min(g.final_s for g in run.generations)
    assert not wrong_tokens(run, expected), wrong_tokens(run, expected)
    # Admission needs min(prompt's blocks + 1, all it will hold) free: >= 2 for each of these, so at most 14 / 2
    # sequences step at once: the rest waited.
    assert run.max_batch() <= SMALL_BLOCKS // 2 < len(asks)
    assert (run.records().groupby("request").step.first() == 0).all()
    assert probe(server, SMALL)[-1].free_blocks == SMALL_BLOCKS


def test_a_cancelled_generation_gives_its_blocks_back(server) -> None:
    run = stream_kv(server, SMALL, [KvAsk("gone", "Beautiful is better", 200, cancel_after=3)], timeout_s=60)
    gone = run["gone"]
    assert 3 <= len(gone.tokens) < 200 and gone.tokens[0].blocks > 0, gone.tokens
    # The cancel reaches the model asynchronously (gRPC, then the stub's next step): probe until whole, bounded.
    deadline, seen = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        seen = probe(server, SMALL)
        if seen[-1].free_blocks == SMALL_BLOCKS:
            break
        time.sleep(0.2)
    assert seen[-1].free_blocks == SMALL_BLOCKS, [(t.blocks, t.free_blocks) for t in seen]


@pytest.mark.parametrize("model, ask, words", [
    (MODEL, KvAsk("long", "x" * 250, 10), "at most 256"),
    (SMALL, KvAsk("huge", "x" * 200, 50), "needs 16 KV blocks and the pool has 14"),
])
def test_what_cannot_run_is_refused_in_one_line(server, model, ask, words) -> None:
    run = stream_kv(server, model, [ask], timeout_s=60)
    assert len(run.errors) == 1 and words in run.errors[0] and "\n" not in run.errors[0], run.errors
    assert probe(server, model)[-1].free_blocks == (KV_BLOCKS if model == MODEL else SMALL_BLOCKS)
