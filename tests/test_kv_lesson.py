"""Notebook 08c's checks of the models' records refuse what they must (no server: records built here).

The notebook runs them on a real server under nbval, where they pass; this shows they are not vacuous: a
record one block short (an off-by-one at a block boundary), a contiguous sequence holding less than it
reserved, blocks still held after the last token, a decode at step 0 each make the check false.
"""

from __future__ import annotations

import math

from lab_backends.lessons import kv_lesson
from lab_backends.measure.kv_streams import KvAsk, KvGeneration, KvRun, KvToken

BT = 8


def run_of(prompt: int, tokens: int, blocks=None, kinds=None) -> KvRun:
    """One generation as a paged model records it: after step s, ceil((prompt + s) / BT) blocks; 0 after the last."""
    ask = KvAsk("a", "x" * prompt, tokens)
    g = KvGeneration(ask, sent_s=0.0, final_s=1.0)
    for s in range(tokens):
        held = 0 if s == tokens - 1 else math.ceil((prompt + s) / BT)
        kind = "prefill" if s == 0 else "decode"
        g.tokens.append(KvToken("a", s, "y", (kinds or {}).get(s, kind), 1, (blocks or {}).get(s, held), 100, s / 10))
    return KvRun("m", [g], 1.0)


def test_paged_records_as_the_code_says_pass() -> None:
    run = run_of(prompt=6, tokens=20)
    assert kv_lesson.blocks_as_layout(run, BT) and kv_lesson.kinds_as_taught(run)
    table = kv_lesson.milestones(run)
    # the prefill, the new blocks at 9 and 17 cached tokens (steps 3 and 11), the end
    assert list(table["step"]) == [0, 3, 11, 19] and list(table["blocks"]) == [1, 2, 3, 0]


def test_an_off_by_one_at_a_block_boundary_is_refused() -> None:
    assert not kv_lesson.blocks_as_layout(run_of(prompt=6, tokens=20, blocks={2: 2}), BT)  # 8 cached: 1 block


def test_blocks_kept_after_the_last_token_are_refused() -> None:
    assert not kv_lesson.blocks_as_layout(run_of(prompt=6, tokens=20, blocks={19: 4}), BT)


def test_contiguous_holds_its_reservation_from_the_first_step() -> None:
    run = run_of(prompt=6, tokens=5, blocks={0: 32, 1: 32, 2: 32, 3: 32})
    assert kv_lesson.blocks_as_layout(run, BT, reserve=32)
    assert not kv_lesson.blocks_as_layout(run_of(prompt=6, tokens=5, blocks={0: 32, 1: 32, 2: 31, 3: 32}), BT,
                                          reserve=32)


def test_a_decode_at_step_zero_is_refused() -> None:
    assert not kv_lesson.kinds_as_taught(run_of(prompt=6, tokens=5, kinds={0: "decode"}))
    assert not kv_lesson.kinds_as_taught(run_of(prompt=6, tokens=5, kinds={3: "prefill"}))
