"""Audit cases of ``batch_of_eight`` (notebook 11): the learner's request in a batch of at least 8 of 16.

Every wrong batcher here closes its batches below 8 by the batcher's own rule, whatever the
machine's speed: a preferred size under 8 caps the batch (core src/dynamic_batch_scheduler.cc
594-617 at r24.10); the others are refused from the config before any request.
"""

from lab_backends.lessons.exercises.audit import Wrong


def _whole_burst(config):
    """Edits the ModelConfig in place: a batch closes at 16, the whole burst, or after 200 ms.

    Not a preferred size of 8: the batcher may hand a first batch to the instance before 8 are
    queued and then grow it (src/dynamic_batch_scheduler.cc 636-645), and a batch of 7 was measured
    for the learner's request: 8 is not a size the batcher promises.
    """
    config.dynamic_batching.preferred_batch_size.append(16)
    config.dynamic_batching.max_queue_delay_microseconds = 200_000


WRONG = [
    Wrong("the demonstration's batcher (preferred size 4)",
          {"dynamic_batching": {"max_queue_delay_microseconds": 100_000, "preferred_batch_size": [4]}},
          r"preferred_batch_size \[4\] closes a batch as soon as 4 requests wait"),
    Wrong("preferred sizes 2 and 6", {"dynamic_batching": {"max_queue_delay_microseconds": 100_000,
                                                           "preferred_batch_size": [2, 6]}},
          r"preferred_batch_size \[2, 6\] closes a batch"),
    Wrong("changes max_batch_size too", {"dynamic_batching": {"max_queue_delay_microseconds": 100_000},
                                         "max_batch_size": 8}, r"change only dynamic_batching"),
    Wrong("more instances instead of a batcher setting",
          {"dynamic_batching": {"max_queue_delay_microseconds": 100_000},
           "instance_group": [{"kind": "KIND_CPU", "count": 2}]}, r"change only dynamic_batching"),
    Wrong("no batcher", {"dynamic_batching": None}, r"no dynamic_batching"),
]

ALTERNATIVES = [
    _whole_burst,
    # No preferred size (Triton makes it [max_batch_size]): the batcher waits out the delay and takes all 16.
    {"dynamic_batching": {"max_queue_delay_microseconds": 300_000}},
]
