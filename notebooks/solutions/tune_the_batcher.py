"""Solution: tune cost_model's batcher for throughput under a p99 bound (notebook 03).

Following Triton's own advice for the dynamic batcher: start with ``dynamic_batching { }`` (no
delay, no preferred sizes) and measure. With 32 requests in flight the queue is never empty, so the
batcher needs no delay to build large batches: whenever the instance frees up it takes everything
waiting, up to max_batch_size (64), and a batch of 16-32 costs 13-16 ms. That already passes.
Only if it did not would you raise max_batch_size, then try a small max_queue_delay, measuring
each step; preferred_batch_size is for specific cases (a backend that runs only a few batch
shapes well, e.g. TensorRT optimization profiles), not a general fix for delays.
"""

answer = {"dynamic_batching": {}}
