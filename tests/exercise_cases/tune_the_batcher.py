"""Audit cases of ``tune_the_batcher`` (notebook 03): a batcher config for an engine that runs at most 16 rows
a batch, under a throughput and a p99 bound.

Most wrong answers are refused before anything is measured (no batcher, two instances, no cap on the
batch, a cap by preferred size only, a field that does not exist). Only ``max_batch_size: 1`` is
measured: batches of one cannot pass 4x the unbatched throughput, whatever the machine's speed.
"""

from lab_backends.lessons.exercises.audit import Wrong


def _more_instances(config):
    config.max_batch_size = 16
    config.dynamic_batching.max_queue_delay_microseconds = 1000
    config.instance_group[0].count = 2


def _small_delay(config):
    config.max_batch_size = 12
    config.dynamic_batching.max_queue_delay_microseconds = 2000  # edits the ModelConfig in place


WRONG = [
    Wrong("no batcher at all", {"max_batch_size": 16, "dynamic_batching": None}, r"no dynamic_batching"),
    Wrong("two instances instead of batching", _more_instances, r"runs 2 instances; the task allows one"),
    Wrong("the plain batcher, without a cap: batches may grow to 64", {"dynamic_batching": {}},
          r"lets a batch grow to max_batch_size 64 rows; the engine runs at most 16.*the field to set"),
    Wrong("a preferred size of 16 instead of a cap",
          {"dynamic_batching": {"preferred_batch_size": [16], "max_queue_delay_microseconds": 5000}},
          r"max_batch_size 64 rows.*preferred_batch_size does not cap a batch"),
    Wrong("max_batch_size 1: the batcher can only send batches of one", {"max_batch_size": 1, "dynamic_batching": {}},
          r"throughput must reach 4x.*every batch held one request"),
    Wrong("a field that does not exist", {"max_batch_size": 16, "dynamic_batching": {"max_delay_ms": 5}},
          r"could not be applied"),
]

ALTERNATIVES = [_small_delay]
