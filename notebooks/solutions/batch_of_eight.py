"""Reference solution of exercise ``batch_of_eight`` (notebook 11): only the batcher changes.

A long max_queue_delay lets the scheduler wait for the burst (its 16 requests reach the server
within a few milliseconds); the preferred size of 16 closes the batch as soon as all are there,
so nobody waits the full 100 ms.
"""

answer = {"dynamic_batching": {"max_queue_delay_microseconds": 100_000, "preferred_batch_size": [16]}}
