"""Audit cases of ``tune_the_batcher`` (notebook 03): a batcher config under a throughput and a p99 bound.

Only the 200 ms delay is measured among the wrong answers: it misses both bounds by far (32 in
flight never fill max_batch_size 64, so every batch waits out the delay: p99 >= 200 ms, and at
most ~160 req/s, under 2x the unbatched ~85), whatever the machine's speed.
"""

from lab_backends.lessons.exercises.audit import Wrong


def _more_instances(config):
    config.dynamic_batching.max_queue_delay_microseconds = 1000
    config.instance_group[0].count = 2


def _small_delay(config):
    config.dynamic_batching.max_queue_delay_microseconds = 2000  # edits the ModelConfig in place


WRONG = [
    Wrong("no batcher at all", {"dynamic_batching": None}, r"no dynamic_batching"),
    Wrong("two instances instead of batching", _more_instances, r"runs 2 instances; the task allows one"),
    Wrong("a 200 ms delay", {"dynamic_batching": {"max_queue_delay_microseconds": 200000}},
          r"throughput must reach 4x.*p99 must stay at or under 100 ms"),
    Wrong("a field that does not exist", {"dynamic_batching": {"max_delay_ms": 5}}, r"could not be applied"),
]

ALTERNATIVES = [_small_delay]
