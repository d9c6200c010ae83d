"""Solution: tune cost_model's batcher for throughput under a p99 bound (notebook 03).

With 32 requests in flight, a batch of 16-32 costs 13-16 ms, so dispatching as soon as a large
batch is queued keeps p99 near two executions. A short max_queue_delay lets the batcher wait a
moment for stragglers; preferred sizes the load can fill stop it from waiting the whole delay.
"""

answer = {
    "dynamic_batching": {
        "max_queue_delay_microseconds": 2000,
        "preferred_batch_size": [16, 32],
    },
}
