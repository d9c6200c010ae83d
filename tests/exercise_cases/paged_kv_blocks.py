"""Audit cases of ``paged_kv_blocks`` (the KV-cache lesson): append() and release() of the paged cache's table.

The reference is generate_kv's own ``kv_blocks.py`` (model_repository/generate_kv/1/). Each wrong answer is
that file with one fault a learner writes, put in (a scratch file per case); the checker drives each one
directly first, where every fault here is found on every run (no timing is involved), and serves only
what passes. The alternatives are written the other ways a correct table can be: the free list used
first-in first-out, the last block indexed from the end, blocks given back one by one, a list for a pair
and names of one's own, the count left behind after release (admit() resets it).
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
NONE = "            if not self.free:\n                return None\n"

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
    Wrong("never counts the token (self.length stays where admit() put it)",
          _variant("never_counts", (COUNT, "")),
          r"did not count token 1: self\.length\['A'\] is 0 after it, not 2"),
    Wrong("returns None whenever the free list is empty, before asking whether a block is needed",
          _variant("none_before_need", (FIRST, "        if not self.free:\n            return None\n" + FIRST),
                   (NONE, "")),
          r"returned None at token \d+, whose place is in its last block .*it has room"),
    Wrong("takes a block without looking whether one is free",
          _variant("no_none_check", (NONE, "")),
          r"with no free block raised IndexError: .*return None"),
    Wrong("returns the block's index in the sequence's table instead of the pool's block number",
          _variant("table_index",
                   (PLACE, "        return position // self.block_tokens, position % self.block_tokens")),
          r"0 is the block's index in the sequence's table"),
    Wrong("counts first, then takes the offset from the new count",
          _variant("offset_after_count", (FIRST + FULL, "        self.length[key] += 1\n        position = "
                                          "self.length[key] - 1\n" + FULL), (COUNT, ""),
                   (PLACE, "        return self.blocks[key][-1], self.length[key] % self.block_tokens")),
          r"that offset is the NEXT token's"),
    Wrong("release gives the blocks back but leaves them listed in the sequence's table",
          _variant("keeps_table", (FREE, "        self.free.extend(self.blocks[key])")),
          r"after release\('A'\), self\.blocks\['A'\] still lists"),
    Wrong("release removes from the list it iterates over (every other block is skipped)",
          _variant("mutates_while_iterating", (FREE, "        for block in self.blocks[key]:\n"
                                                     "            self.free.append(block)\n"
                                                     "            self.blocks[key].remove(block)")),
          r"a block leaked after a finished \(or cancelled\) sequence: release\('A'\) left block\(s\) \[\d+\] "
          r"of its 3"),
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
    _variant("list_pair_own_names",
             (FIRST + FULL, "        held, used = self.blocks[key], self.length[key]\n"
                            "        if used == len(held) * self.block_tokens:"),
             (NONE + TAKE, "            if len(self.free) == 0:\n                return None\n"
                           "            held.append(self.free.pop(0))"),
             (COUNT + PLACE, "        self.length[key] += 1\n"
                             "        return [held[used // self.block_tokens], used - used // self.block_tokens "
                             "* self.block_tokens]"),
             (FREE + "\n        self.length.pop(key, None)",
              "        for block in self.blocks.pop(key):\n            self.free.insert(0, block)")),
]
