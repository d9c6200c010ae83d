"""Audit cases of ``paged_kv_blocks`` (the KV-cache lesson): append() and release() of the paged cache's table.

The reference is generate_kv's own ``kv_blocks.py`` (model_repository/generate_kv/1/). Each wrong answer is
that file with one fault a learner writes, put in (a scratch file per case); the checker drives each one
directly first, where every fault here is found on every run (no timing is involved), and serves only
what passes. The alternatives are written the other ways a correct table can be: the free list used
first-in first-out, the last block indexed from the end, blocks given back one by one.
"""

from lab_backends.lessons.exercises.audit import SourceVariants, Wrong
from lab_backends.lessons.exercises.registry import load_solution

REFERENCE = load_solution("paged_kv_blocks").read_text()
_SOURCES = SourceVariants(REFERENCE, "kv-blocks", suffix=".py")
_variant = _SOURCES.variant

FULL = "        if position % self.block_tokens == 0:  # the last block is full (or there is none yet)"
TAKE = "            self.blocks[key].append(self.free.pop())"
COUNT = "        self.length[key] = position + 1\n"
PLACE = "        return self.blocks[key][position // self.block_tokens], position % self.block_tokens"
FREE = "        self.free.extend(self.blocks.pop(key, []))"
FIRST = "        position = self.length[key]\n"

WRONG = [
    Wrong("takes a new block only once the position is PAST the blocks' capacity (> instead of >=)",
          _variant("past_capacity", (FULL, "        if position > len(self.blocks[key]) * self.block_tokens:")),
          r"off-by-one at a block boundary: .*no new block was taken when the last was full"),
    Wrong("takes the next block one token early (when the last block has one slot left)",
          _variant("one_early", (FULL, "        if position % self.block_tokens == self.block_tokens - 1 or "
                                       "not self.blocks[key]:")),
          r"off-by-one at a block boundary: .*a new block was taken while the last had room"),
    Wrong("offset counted from the sequence's start instead of the block's",
          _variant("offset_from_start", (PLACE, "        return self.blocks[key][-1], position")),
          r"offset 4 is past the end of a block of 4: off-by-one at a block boundary"),
    Wrong("release forgets the sequence but gives no block back",
          _variant("forgets_blocks", (FREE, "        del self.blocks[key]")),
          r"a block leaked after a finished \(or cancelled\) sequence: release\('A'\) left block\(s\) "
          r"\[\d+, \d+, \d+\]"),
    Wrong("release gives back only the last block",
          _variant("last_block_only", (FREE, "        self.free.append(self.blocks.pop(key)[-1])")),
          r"a block leaked after a finished \(or cancelled\) sequence: release\('A'\) left block\(s\) \[\d+, \d+\] "
          r"of its 3"),
    Wrong("takes the free list's last block without taking it off the list",
          _variant("peeks_free_list", (TAKE, "            self.blocks[key].append(self.free[-1])")),
          r"a block shared between sequences"),
    Wrong("counts the token before finding there is no free block",
          _variant("counts_before_none", (FIRST, FIRST + COUNT), (COUNT + PLACE, PLACE)),
          r"returned None but changed .* returning None must change nothing"),
]

ALTERNATIVES = [
    _variant("fifo_last_block_loop",
             (TAKE, "            self.blocks[key].append(self.free.pop(0))"),
             (PLACE, "        return self.blocks[key][-1], position % self.block_tokens"),
             (FREE, "        for block in self.blocks[key]:\n            self.free.append(block)\n"
                    "        self.blocks[key] = []")),
    _variant("capacity_and_divmod",
             (FULL, "        if position == len(self.blocks[key]) * self.block_tokens:"),
             (PLACE, "        index, offset = divmod(position, self.block_tokens)\n"
                     "        return self.blocks[key][index], offset"),
             (FREE, "        while self.blocks.get(key):\n            self.free.append(self.blocks[key].pop())\n"
                    "        self.blocks.pop(key, None)")),
]
