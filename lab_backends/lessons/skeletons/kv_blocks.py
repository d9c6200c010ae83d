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

YOUR PART: append() and release(). Keep the three attributes as they are: ``self.free`` (list of free
block numbers) and ``self.blocks`` (key -> its blocks, in position order), which model.py reads, and
``self.length`` (key -> tokens cached so far), which admit() starts at 0 and the checker reads.
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
        # TODO(exercise): the next token's position is self.length[key]; take a block from self.free
        # when the sequence needs a new one, count the token, and return (block, offset).
        raise NotImplementedError

    def release(self, key) -> None:
        """``key`` ended (its last token sent, or its request cancelled): every block it held is free again."""
        # TODO(exercise): give every block of ``key`` back to self.free, and forget ``key``.
        raise NotImplementedError
