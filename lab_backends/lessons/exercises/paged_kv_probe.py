"""The first half of the ``paged_kv_blocks`` checker: a learner's ``BlockTable`` driven directly, fault by fault.

Serving a wrong ``kv_blocks.py`` shows THAT something is wrong (a token differs, the pool never comes back
whole), rarely WHICH line. So before it serves the file, the checker drives the class by hand through a
scenario with a pool of 8 blocks of 4 tokens, checking after every call what a correct table must satisfy:

1. sequence A's first 6 tokens: each ``append`` returns ``(self.blocks[A][p // 4], p % 4)`` and A holds
   ceil((p + 1) / 4) blocks after token p (one too many or too few is the off-by-one at a block boundary);
2. A and B grow in turns: no block is in two tables (a cache shared between sequences), none is both held
   and free, and every block is either free or held (none leaked);
3. ``release(A)``: all of A's blocks are free again (a block leaked after a finished sequence);
4. C grows until the pool is empty: the ``append`` that needs a block when none is free returns None and
   changes nothing (model.py asks again at the next step: the token must keep its position);
5. ``release`` of everyone (ends and cancellations both call it): the whole pool is free.

It runs in a child process with a deadline (``python -m`` this module, by :func:`probe_file`): a learner's
loop that never ends costs the deadline, never the notebook's kernel. The first fault found is one line.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

POOL, BLOCK = 8, 4
DEADLINE_S = 20.0


class Fault(Exception):
    """The first thing the learner's table did wrong, as one line."""


def _call(what: str, method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - the learner's code: any exception is the finding
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise Fault(f"{what} raised {type(exc).__name__}: {first[:200]}") from None


def _held(table: Any) -> dict[int, list[str]]:
    """Block -> the sequences whose tables list it (once per listing)."""
    owners: dict[int, list[str]] = {}
    for key, blocks in table.blocks.items():
        for block in blocks:
            owners.setdefault(block, []).append(key)
    return owners


def _invariants(table: Any, after: str) -> None:
    owners = _held(table)
    for block, keys in sorted(owners.items()):
        if len(keys) > 1:
            who = " and ".join(sorted(set(keys))) if len(set(keys)) > 1 else f"{keys[0]} (twice)"
            raise Fault(f"after {after}, block {block} is in the table of {who}: a cache (block) shared between "
                        "sequences, so one's keys and values overwrite the other's; take each new block OFF the free "
                        "list (self.free.pop())")
    both = sorted(set(owners) & set(table.free))
    if both:
        raise Fault(f"after {after}, block {both[0]} is held by {owners[both[0]][0]} and also on the free list: the "
                    "next sequence to take it would write into the same cache (a block shared between sequences); "
                    "take each new block OFF self.free (self.free.pop())")
    lost = sorted(set(range(POOL)) - set(owners) - set(table.free))
    if lost:
        raise Fault(f"after {after}, block(s) {lost} are neither free nor in any sequence's table: leaked, the pool "
                    "shrinks for good")


def _uncounted(table: Any, key: str, p: int) -> bool:
    """Whether ``self.length[key]`` (the skeleton's count) is not p + 1 after the append of token ``p``."""
    length = getattr(table, "length", None)
    return isinstance(length, dict) and length.get(key) != p + 1


def _misplaced(block: Any, offset: Any, p: int, blocks: list) -> str:
    """Why (block, offset) is not token p's place, in the words of the mistake that gives it."""
    if isinstance(offset, int) and offset >= BLOCK:
        return f"offset {offset} is past the end of a block of {BLOCK}: off-by-one at a block boundary"
    if block == p // BLOCK != blocks[p // BLOCK]:
        return (f"{block} is the block's index in the sequence's table (p // block_tokens), not the pool's block "
                f"number: return self.blocks[key][{p // BLOCK}]")
    if block == blocks[p // BLOCK] and offset == (p + 1) % BLOCK:
        return ("that offset is the NEXT token's: take the position before counting the token "
                "(position = self.length[key], then count it)")
    return "token p goes in block self.blocks[key][p // block_tokens] at offset p % block_tokens"


def _grow(table: Any, key: str, upto: int) -> None:
    """Append ``key``'s tokens until it has ``upto`` cached, checking each slot and the block count."""
    while table.length_of(key) < upto:
        p = table.length_of(key)
        need = p // BLOCK + 1
        try:
            slot = _call(f"append({key!r}) at token {p}", table.t.append, key)
        except Fault as fault:
            held = len(table.t.blocks.get(key, []))
            if "IndexError" in str(fault) and held < need:
                raise Fault(f"off-by-one at a block boundary: {fault}, with {held} block(s) held where token {p} "
                            f"needs {need} (blocks of {BLOCK}): no new block was taken when the last was full (or "
                            "there was none)") from None
            raise
        blocks = table.t.blocks.get(key, [])
        if slot is None:
            if len(blocks) * BLOCK > p:
                raise Fault(f"append({key!r}) returned None at token {p}, whose place is in its last block (block "
                            f"{blocks[p // BLOCK]}, offset {p % BLOCK}: it has room): return None only when the "
                            "sequence needs a NEW block and self.free is empty")
            raise Fault(f"append({key!r}) returned None at token {p} while {len(table.t.free)} block(s) were free")
        if _uncounted(table.t, key, p) and (len(blocks) != need or slot != (blocks[p // BLOCK], p % BLOCK)):
            raise Fault(f"append({key!r}) did not count token {p}: self.length[{key!r}] is "
                        f"{table.t.length.get(key)!r} after it, not {p + 1}, so the next call sees a wrong position; "
                        "count it (self.length[key] = position + 1)")
        if len(blocks) > need:
            raise Fault(f"off-by-one at a block boundary: after token {p} of {key} ({p + 1} tokens, blocks of "
                        f"{BLOCK}) it holds {len(blocks)} blocks, not {need}: a new block was taken while the last "
                        f"had room; take one only when the position is a multiple of {BLOCK}")
        if len(blocks) < need:
            raise Fault(f"off-by-one at a block boundary: token {p} of {key} needs block {need} of its table (blocks "
                        f"of {BLOCK} tokens) and it holds {len(blocks)}: no new block was taken when the last was "
                        "full")
        try:
            block, offset = slot
        except (TypeError, ValueError):
            raise Fault(f"append({key!r}) returned {slot!r}: return a pair (block, offset), or None") from None
        if (block, offset) != (blocks[p // BLOCK], p % BLOCK):
            raise Fault(f"append({key!r}) returned ({block}, {offset}) for token {p}, whose place is "
                        f"({blocks[p // BLOCK]}, {p % BLOCK}): {_misplaced(block, offset, p, blocks)}")
        table.count[key] = p + 1
        _invariants(table.t, f"append({key!r}) at token {p}")


class _Driven:
    """The learner's table and our own count of each sequence's tokens (we trust ours, not theirs)."""

    def __init__(self, cls: type) -> None:
        self.t = _call(f"BlockTable({POOL}, {BLOCK})", cls, POOL, BLOCK)
        self.count: dict[str, int] = {}

    def length_of(self, key: str) -> int:
        return self.count[key]

    def admit(self, key: str, prompt: int) -> None:
        if not _call(f"admit({key!r}, {prompt}, 64)", self.t.admit, key, prompt, 64):
            raise Fault(f"admit({key!r}, {prompt}, 64) refused with {len(self.t.free)} free blocks: leave admit() as "
                        "handed out")
        self.count[key] = 0

    def release(self, key: str) -> None:
        held = list(self.t.blocks.get(key, []))
        _call(f"release({key!r})", self.t.release, key)
        kept = [b for b in held if b not in self.t.free]
        if kept:
            raise Fault(f"a block leaked after a finished (or cancelled) sequence: release({key!r}) left block(s) "
                        f"{kept} of its {len(held)} off the free list; give every block it held back to self.free")
        if self.t.blocks.get(key):
            raise Fault(f"after release({key!r}), self.blocks[{key!r}] still lists {self.t.blocks[key]}: forget the "
                        "sequence (or empty its list), or its blocks count twice")
        _invariants(self.t, f"release({key!r})")


def scenario(cls: type) -> str:
    """Run the scenario on ``cls``; a :class:`Fault` names the first fault, else a summary."""
    d = _Driven(cls)
    _invariants(d.t, "BlockTable(8, 4)")
    d.admit("A", 6)
    _grow(d, "A", 6)
    d.admit("B", 3)
    for upto in range(1, 10):  # in turns: A to 9 tokens, B to 9
        _grow(d, "A", max(upto, 6))
        _grow(d, "B", upto)
    d.release("A")
    d.admit("C", 5)
    _grow(d, "C", 5)
    free_blocks = len(d.t.free)
    _grow(d, "C", d.count["C"] + free_blocks * BLOCK + (-d.count["C"]) % BLOCK)  # every free block taken
    def state() -> tuple:
        return list(d.t.free), list(d.t.blocks.get("C", [])), getattr(d.t, "length", {}).get("C")

    full, before = d.count["C"], state()
    try:
        slot = _call(f"append('C') at token {full} with no free block", d.t.append, "C")
    except Fault as fault:
        if "IndexError" in str(fault):
            raise Fault(f"{fault}: when a new block is needed and self.free is empty, return None (model.py lets "
                        "the sequence wait) instead of taking one") from None
        raise
    if slot is not None:
        raise Fault(f"append('C') returned {slot!r} at token {full}, which needs a new block, while none was free: "
                    "return None (model.py lets the sequence wait)")
    if state() != before:
        raise Fault("append('C') returned None but changed the free list, C's blocks or its length (free list, "
                    f"blocks, length before: {before}, after: {state()}): returning None must change nothing, "
                    "model.py asks again for the same token at the next step")
    d.release("B")
    _grow(d, "C", full + 1)  # its place is still token `full`: the None changed nothing
    d.release("C")
    d.admit("A", 1)  # a key used before starts again from nothing
    _grow(d, "A", 5)
    d.release("A")
    if sorted(d.t.free) != list(range(POOL)):
        raise Fault(f"after every sequence ended the free list is {sorted(d.t.free)}, not blocks 0-{POOL - 1}")
    return f"driven directly: 4 sequences, {POOL} blocks of {BLOCK} tokens, pool exhausted once, every block back"


def probe_file(path: Path, timeout_s: float = DEADLINE_S) -> tuple[bool, str]:
    """(passed, one line) for the file at ``path``, judged in a child process within ``timeout_s``."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(path)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, (f"a call into your BlockTable did not return within {timeout_s:g} s (driven directly, 8 blocks "
                       "of 4 tokens): a loop that never ends in append() or release()?")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"your kv_blocks.py stopped the checker's process: {last}"
    verdict = json.loads(lines[-1])
    return verdict["passed"], verdict["message"]


def _main(path: str) -> None:
    try:
        namespace = runpy.run_path(path, run_name="kv_blocks")
    except Exception as exc:  # noqa: BLE001 - the learner's file: any failure to load is the finding
        print(json.dumps({"passed": False, "message": f"loading kv_blocks.py raised {type(exc).__name__}: {exc}"}))
        return
    cls = namespace.get("BlockTable")
    if not isinstance(cls, type):
        print(json.dumps({"passed": False, "message": "kv_blocks.py defines no class BlockTable: model.py imports it"}))
        return
    try:
        print(json.dumps({"passed": True, "message": scenario(cls)}))
    except Fault as fault:
        print(json.dumps({"passed": False, "message": str(fault)}))


if __name__ == "__main__":
    _main(sys.argv[1])
