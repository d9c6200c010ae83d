"""Audit cases of ``queue_holds_one_batch`` (notebook 03b): plausible wrong policies, and right ones shaped
unlike the reference (see :mod:`lab_backends.lessons.exercises.audit`)."""

from lab_backends.lessons.exercises.audit import Wrong


def _policy(**fields):
    return {"dynamic_batching": {"default_queue_policy": fields}}


WRONG = [
    Wrong(fault="a 100 ms queue timeout: the accepted requests behind a 200 ms batch expire",
          answer=_policy(max_queue_size=16, default_timeout_microseconds=100_000),
          says=r"expired in the queue.*default_timeout_microseconds 100000.*set no timeout"),
    Wrong(fault="max_queue_size 0 is no limit: nothing is refused",
          answer=_policy(max_queue_size=0),
          says=r"none of the 48 requests was refused.*0 means no limit"),
    Wrong(fault="a queue of 4 refuses requests the next batch had room for",
          answer=_policy(max_queue_size=4),
          says=r"a queue of 4 refused requests the next batch had room for"),
    Wrong(fault="a queue of 24 keeps requests waiting for a third batch",
          answer=_policy(max_queue_size=24),
          says=r"a queue of 24 holds more than the next batch"),
    Wrong(fault="a long timeout with DELAY: nothing expires here, but the task asks for no timeout",
          answer=_policy(max_queue_size=16, default_timeout_microseconds=5_000_000, timeout_action="DELAY"),
          says=r"has a queue timeout \(default_timeout_microseconds 5000000, timeout_action DELAY\)"),
    Wrong(fault="a second instance as well: only the queue policy may change",
          answer={"instance_group": [{"kind": "KIND_CPU", "count": 2}], **_policy(max_queue_size=16)},
          says=r"only the queue policy may change.*instance_group"),
    Wrong(fault="a shorter batch delay as well: max_queue_delay is the batcher's, not the queue policy",
          answer={"dynamic_batching": {"max_queue_delay_microseconds": 5000,
                                       "default_queue_policy": {"max_queue_size": 16}}},
          says=r"only the queue policy may change.*max_queue_delay_microseconds"),
    Wrong(fault="the limit on priority level 1, but requests without a priority go to the default level 2",
          answer={"dynamic_batching": {"priority_levels": 2, "default_priority_level": 2,
                                       "priority_queue_policy": {"1": {"max_queue_size": 16}}}},
          says=r"none of the 48 requests was refused.*default_priority_level 2 has no priority_queue_policy"),
]


def _one_batch(config):
    """Edit the ModelConfig in place: the queue holds what one batch takes."""
    config.dynamic_batching.default_queue_policy.max_queue_size = config.max_batch_size


ALTERNATIVES = [
    _one_batch,
    # One priority level whose own policy holds one batch; requests without a priority land on it.
    {"dynamic_batching": {"priority_levels": 1, "default_priority_level": 1,
                          "priority_queue_policy": {"1": {"max_queue_size": 16}}}},
    # Overrides allowed but no default timeout: a request's own timeout is then ignored (scheduler_utils.cc 180-184).
    {"dynamic_batching": {"preferred_batch_size": [16],
                          "default_queue_policy": {"max_queue_size": 16, "allow_timeout_override": True}}},
]
