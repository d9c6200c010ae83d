"""Notebook 03b's exercise (``queue_holds_one_batch``): a queue policy that refuses a burst's excess at once.

The checker reloads ``scheduler_probe`` with ONE instance, batches of up to :data:`BATCH` and
:data:`FIXED_MS` per batch, plus the learner's queue policy, and sends :data:`BURST` requests at
once. What it judges rests on evidence that does not depend on the machine's speed:

* each request's own outcome: Triton's error text ("Exceeds maximum queue size" is returned when
  the request is enqueued, core ``src/scheduler_utils.cc`` 170-176 at r24.10; "Request timeout
  expired" when the batcher rejects an expired one, ``src/dynamic_batch_scheduler.cc`` 70-71), and
  whether each served request got its own input back (``scheduler_probe`` echoes ``INPUT0``);
* the model's statistics over the burst (successes, failures, executions): a refused request is
  never queued, so it is in none of them, while an expired one counts as a failure;
* the config: the policy that applies to the burst's requests (they carry no priority, so it is
  the default level's, ``src/infer_request.cc`` 240-247) must hold exactly one batch and no timeout.

The whole burst reaches the server in a few milliseconds, far less than one batch (200 ms): every
accepted request is queued while the first batch runs, so a queue of ``max_queue_size`` requests
runs as the second batch, whatever the speed of the machine. With a policy the batcher may stall
500 ms before that batch (03b explains why); that costs time, not evidence.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import numpy as np

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ExerciseError, LabBackendsError
from lab_backends.lessons.exercises.overrides import learner_batcher
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.measure import stats as _stats
from lab_backends.server.config_changes import derive_config
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer
from lab_backends.server.warmup import with_warmup

MODEL = "scheduler_probe"
BURST = 48
BATCH = 16
FIXED_MS = 200
#: The fields of ``dynamic_batching`` that make up the queue policy: the only ones an answer may change.
POLICY_FIELDS = ("default_queue_policy", "priority_levels", "default_priority_level", "priority_queue_policy")
FULL = "Exceeds maximum queue size"
EXPIRED = "Request timeout expired"


@exercise(
    "queue_holds_one_batch",
    notebook="03b_inside_the_scheduler",
    task=(
        f"Write a queue policy for {MODEL} (a dict such as {{'dynamic_batching': {{'default_queue_policy': "
        f"{{...}}}}}}, or a function that edits the ModelConfig it gets). The checker gives the model ONE instance, "
        f"batches of up to {BATCH} and {FIXED_MS} ms per batch, applies your policy, and sends a burst of {BURST} "
        f"requests at once. Every request the server accepts must run in the next batch at the latest, and that "
        f"batch must be full: the queue holds one batch, no more, no less. The rest must be refused at once with "
        f"'{FULL}' (so their clients can retry elsewhere), no request may expire in the queue (no timeout), and "
        f"every served request must get its own input back. Change only the queue policy."
    ),
    models=(MODEL,),
)
def _check_queue_holds_one_batch(answer: Any, server: RunningServer | None) -> str:
    """Reload the probe with the learner's policy on ``server``, send the burst, restore the model."""
    if answer is None:
        raise NotImplementedError("set my_policy to your override (a dict or a function) and run the check again")
    with contextlib.ExitStack() as stack:
        if server is None or not server.model_ready(MODEL):  # e.g. a server started for another lesson
            server = stack.enter_context(TritonServer(models=[MODEL], target="local"))
        live = server.model_config(MODEL)
        base = burst_base(live)
        tuned = policy_config(base, answer)
        where, policy = burst_policy(tuned.dynamic_batching)
        stack.callback(server.load_model, MODEL, live)  # give the learner's server back as it was
        try:
            server.load_model(MODEL, config=with_warmup(tuned, 2))  # Triton warms the instance up, no queue
        except LabBackendsError as exc:
            raise ExerciseError(f"Triton refused to load your config: {str(exc)[:400]}") from exc
        before = _stats.settled_statistics(server, MODEL)
        rows = burst(server, BURST)
        seen = _stats.window(before, _stats.settled_statistics(server, MODEL), MODEL)
    return judge(rows, seen, where, policy)


def burst_base(live: Any) -> Any:
    """The config every answer starts from: one instance, batches of 16, 200 ms each, a batcher with no policy."""
    return derive_config(live, {"instance_group": [{"kind": "KIND_CPU", "count": 1}], "max_batch_size": BATCH,
                                "parameters": {"fixed_ms": {"string_value": str(FIXED_MS)}},
                                "dynamic_batching": {}})


def policy_config(base: Any, answer: Any) -> Any:
    """``base`` with the learner's override; refused when it changes anything but the queue policy."""
    tuned = learner_batcher(base, answer, "the config has no dynamic_batching: the queue policy lives inside it "
                            "({'dynamic_batching': {'default_queue_policy': {...}}})")
    changed = [f.name for f in _differing(_without_policy(base), _without_policy(tuned))]
    if changed:
        raise ExerciseError(
            f"only the queue policy may change, but your override also changed {', '.join(changed)}: change "
            "default_queue_policy (or priority levels and their policies) and leave the rest as the checker sets it"
        )
    return tuned


def _without_policy(config: Any) -> Any:
    """A copy without the queue-policy fields; Triton's default preferred size (max_batch_size) counts as none."""
    copy = type(config)()
    copy.CopyFrom(config)
    for name in POLICY_FIELDS:
        copy.dynamic_batching.ClearField(name)
    if list(copy.dynamic_batching.preferred_batch_size) == [copy.max_batch_size]:
        # What Triton fills in when none is given (core src/model_config_utils.cc 738-742 at r24.10).
        copy.dynamic_batching.ClearField("preferred_batch_size")
    return copy


def _differing(a: Any, b: Any) -> list[Any]:
    """The fields (descriptors) whose values differ, one level into ``dynamic_batching``."""
    names = {f.name: f for f, _ in a.ListFields()} | {f.name: f for f, _ in b.ListFields()}
    out = []
    for name, field in sorted(names.items()):
        if name == "dynamic_batching":
            out += _differing(a.dynamic_batching, b.dynamic_batching)
        elif getattr(a, name) != getattr(b, name):
            out.append(field)
    return out


def burst_policy(batching: Any) -> tuple[str, Any]:
    """(where it is, ModelQueuePolicy): the policy a request with no priority is queued under.

    With priority levels such a request goes to ``default_priority_level`` (core ``src/infer_request.cc``
    240-247), whose queue follows ``priority_queue_policy[level]`` if given, else ``default_queue_policy``
    (``src/scheduler_utils.cc`` 387: ``PriorityQueue::Enqueue`` gives a level without one the default policy).
    """
    if batching.priority_levels == 0:
        return "default_queue_policy", batching.default_queue_policy
    level = batching.default_priority_level
    if level in batching.priority_queue_policy:
        return (f"priority_queue_policy of level {level} (the default_priority_level: the burst's requests carry "
                "no priority)"), batching.priority_queue_policy[level]
    return (f"default_queue_policy (default_priority_level {level} has no priority_queue_policy of its own, and the "
            "burst's requests carry no priority)"), batching.default_queue_policy


def burst(server: Any, n: int, deadline_s: float = 60.0) -> list[dict[str, Any]]:
    """Send ``n`` requests at once, request *i* carrying its own values; each row: ok, error, echoed, batch, done_s."""
    rng = np.random.default_rng()
    sent = [rng.integers(-1000, 1000, size=(1, 4)).astype(np.float32) for _ in range(n)]
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    finished = threading.Semaphore(0)
    origin = time.monotonic()

    def callback(i: int):
        def done(result: Any, error: Any) -> None:
            row: dict[str, Any] = {"ok": error is None, "error": "" if error is None else str(error),
                                   "done_s": time.monotonic() - origin, "echoed": False, "batch": 0}
            if error is None:
                out, size = result.as_numpy("OUTPUT0"), result.as_numpy("BATCH")
                row["echoed"] = out is not None and np.array_equal(out, sent[i])
                row["batch"] = int(size.reshape(-1)[0]) if size is not None and size.size else 0
            rows[i] = row
            finished.release()

        return done

    client = server.grpc_client
    for i in range(n):
        client.async_infer(MODEL, make_inputs({"INPUT0": sent[i]}), callback(i), request_id=f"queue-policy-{i}")
    for _ in range(n):
        if not finished.acquire(timeout=max(0.0, origin + deadline_s - time.monotonic())):
            raise ExerciseError(f"{MODEL} did not answer all {n} requests within {deadline_s:.0f} s")
    return rows


def judge(rows: list[dict[str, Any]], seen: Any, where: str, policy: Any) -> str:
    """The verdict on one burst: the first fault found, named with its fix, or what the burst showed."""
    served = [r for r in rows if r["ok"]]
    refused = [r for r in rows if FULL in r["error"]]
    expired = [r for r in rows if EXPIRED in r["error"]]
    other = [r for r in rows if not r["ok"] and FULL not in r["error"] and EXPIRED not in r["error"]]
    size, timeout = policy.max_queue_size, policy.default_timeout_microseconds
    sizes = ", ".join(str(b) for b, n in sorted(seen.batch_hist.items()) for _ in range(n))  # the server's count
    shown = (f"{len(served)} served in {seen.executions} batches (sizes {sizes or 'none'}), {len(refused)} refused, "
             f"{len(expired)} expired")
    if expired:
        raise ExerciseError(
            f"{len(expired)} of {BURST} requests expired in the queue ('{EXPIRED}'): {where} has "
            f"default_timeout_microseconds {timeout}, and a request accepted behind a {FIXED_MS} ms batch waits "
            "longer than that; set no timeout (0)"
        )
    if other:
        raise ExerciseError(f"{len(other)} requests failed with something else than a full queue, first: "
                            f"{other[0]['error'][:300]}")
    wrong = [r for r in served if not r["echoed"]]
    if wrong or seen.requests != len(served) or seen.failures:
        raise ExerciseError(
            f"{len(wrong)} served requests did not get their own input back (statistics: {seen.requests} "
            f"successes, {seen.failures} failures for {len(served)} served): only the queue policy should differ"
        )
    if not refused:
        limit = "0 means no limit" if size == 0 else f"{size} holds the whole burst"
        raise ExerciseError(
            f"none of the {BURST} requests was refused ({shown}): in {where}, max_queue_size {limit}; give the "
            "queue a limit so that the excess is refused at once"
        )
    if size > BATCH:
        raise ExerciseError(
            f"{shown}: a queue of {size} holds more than the next batch of {BATCH}, so the requests behind it "
            f"wait for a later batch; lower max_queue_size in {where} to what one batch takes"
        )
    if size < BATCH:
        raise ExerciseError(
            f"{shown}: a queue of {size} refused requests the next batch had room for ({BATCH} per batch); raise "
            f"max_queue_size in {where} to what one batch takes"
        )
    if timeout:
        raise ExerciseError(
            f"{shown}, but {where} has a queue timeout (default_timeout_microseconds {timeout}, timeout_action "
            f"{'DELAY' if policy.timeout_action else 'REJECT'}): a request that waits longer would "
            f"{'be pushed behind the others' if policy.timeout_action else 'expire'}; the task asks for none (0)"
        )
    return (f"{shown}: the queue held one full batch, the rest of the burst was refused at once with "
            f"'{FULL}', nothing expired, and every served request got its own input back "
            f"(statistics: {seen.requests} successes, {seen.failures} failures).")
