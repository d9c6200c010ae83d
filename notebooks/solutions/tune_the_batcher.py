"""Solution: tune cost_model's batcher for throughput under a p99 bound, for an engine that runs batches
of at most 16 rows (notebook 03).

The cap is ``max_batch_size``: the dynamic batcher never forms a batch larger than it (core
src/dynamic_batch_scheduler.cc L547-L551 at r24.10), while ``preferred_batch_size`` does not cap a
batch (once the queue delay is exceeded the batcher sends all that is pending, up to max_batch_size).
Then Triton's own advice for the dynamic batcher: ``dynamic_batching { }`` (no delay, no preferred
sizes), and measure. With 32 requests in flight the queue is never empty, so the batcher needs no
delay to fill batches of 16: whenever the instance frees up it takes 16 of those waiting, and a batch
of 16 costs 13.2 ms, about 1200 req/s at most against ~85 unbatched. That passes. Only if it did not
would you try a small max_queue_delay, measuring each step.
"""

answer = {"max_batch_size": 16, "dynamic_batching": {}}
