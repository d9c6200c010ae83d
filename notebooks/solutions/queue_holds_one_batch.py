"""Solution: a queue that holds one batch and refuses the rest of a burst at once (notebook 03b).

While the instance runs a batch, the next batch can take at most ``max_batch_size`` (16) requests,
so a queue of exactly 16 gives every accepted request a place in the next batch and fills it; the
17th waiting request would need a later batch, and Triton refuses it at once with "Exceeds maximum
queue size" (core ``src/scheduler_utils.cc`` 170-176 at r24.10). No ``default_timeout_microseconds``
(0 is none): nothing accepted may expire, and with a default of 0 a request's own timeout is
ignored too (180-184).
"""

answer = {"dynamic_batching": {"default_queue_policy": {"max_queue_size": 16}}}
