"""The paged KV cache's bookkeeping: which blocks of the pool each sequence holds (generate_kv's model.py uses it).

The pool (in model.py) is ``kv_blocks`` blocks of ``block_tokens`` token slots, per layer, for keys and
values. A sequence's cached tokens live in the blocks listed in ``self.blocks[key]``, IN POSITION ORDER:
token ``p`` of the sequence is in block ``self.blocks[key][p // block_tokens]`` at offset
``p % block_tokens``. model.py writes each new token's key and value where :meth:`append` says, and
reads a sequence's cache back through that list (vLLM's block table, Kwon et al., SOSP 2023).

Why pages: a sequence holds ceil(tokens / block_tokens) blocks, taken one at a time as it grows, so
the only memory it wastes is the unfilled tail of its last block; a contiguous cache reserves the
longest possible sequence for every sequence up front.

Admission by memory: a newcomer is admitted only when its prompt's blocks plus one are free (fewer if it
will never hold that many); model.py lets one that does not fit wait (its request rescheduled without a
step) instead of failing it.

This file is the KV-cache lesson's exercise (``paged_kv_blocks``): it is handed out with append() and
release() to write. model.py reads ``self.free`` and ``self.blocks``; keep them (and ``self.length``).
"""


class BlockTable:
    def __init__(self, kv_blocks: int, block_tokens: int):
        self.block_tokens = block_tokens
        self.free = list(range(kv_blocks))  # the blocks nobody holds
        self.blocks = {}  # sequence key -> the blocks it holds, in position order
        self.length = {}  # sequence key -> tokens cached so far

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens: ceil(tokens / block_tokens)."""
        return -(-tokens // self.block_tokens)

    def admit(self, key, prompt_tokens: int, most_tokens: int) -> bool:
        """Start ``key`` (no blocks yet) if its prompt's blocks plus one are free (or all the blocks it will ever
        hold, ``most_tokens`` cached, if that is fewer); False: it must wait."""
        if len(self.free) < min(self.blocks_for(prompt_tokens) + 1, self.blocks_for(most_tokens)):
            return False
        self.blocks[key] = []
        self.length[key] = 0
        return True

    def append(self, key):
        """Make room for ``key``'s next token: return (block, offset), where its key and value go.

        A new block is taken from the free list when the sequence's last block is full (or it has none);
        return None, changing nothing, when one is needed and none is free.
        """
        position = self.length[key]
        if position % self.block_tokens == 0:  # the last block is full (or there is none yet)
            if not self.free:
                return None
            self.blocks[key].append(self.free.pop())
        self.length[key] = position + 1
        return self.blocks[key][position // self.block_tokens], position % self.block_tokens

    def release(self, key) -> None:
        """``key`` ended (its last token sent, or its request cancelled): every block it held is free again."""
        self.free.extend(self.blocks.pop(key, []))
        self.length.pop(key, None)
