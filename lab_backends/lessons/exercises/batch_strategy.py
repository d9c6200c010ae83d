"""Notebook 09b's exercise (``one_tenant_per_batch``): a batching strategy in C that never mixes tenants.

The learner completes ``exercises/tenant_batching.c`` next to the notebook, in place (handed out by
set-up: :mod:`lab_backends.lessons.handout`); the checker does what a reviewer and a test server would, in the order a
learner fixes things:

1. reads the source: the skeleton as shipped (the package's copy, never the file being edited) ->
   "not attempted"; then what it frees
   (:func:`~lab_backends.lessons.batch_strategy.allocation_faults`): a ``ModelBatchFinalize`` that
   does not free what ``ModelBatchInitialize``/``IncludeRequest`` allocated leaks once per batch;
2. builds it with ``gcc -Wall -Wextra -Werror -Wl,-z,defs``, all five entry points exported;
3. loads it on ``scheduler_probe`` (one instance, so a burst queues) on a server *of its own* (a
   strategy runs inside tritonserver: a NULL dereference kills the server, which must not be the
   learner's), sends a burst of requests of four tenants in runs (``red``, ``redwood``, ``blue`` and
   no tenant) and rebuilds every batch from the trace: a request never answered (the batcher spins
   on a request the strategy refuses at the head of an empty batch: core
   ``src/dynamic_batch_scheduler.cc`` 564-571 and 605-609 at r24.10), a crash, or a batch holding two
   tenants is each refused with the fault named;
4. loads the same file wrapped in the call log (``c_backends/batching/call_log``: every
   ``IncludeRequest`` logged with the request's id and the answer) and sends bursts that queue runs of
   one tenant behind a slow batch, from separate requests (so two requests of one tenant never share
   a pointer to their tenant's text). What the strategy answered for each request offered to a
   batch that already held one is the evidence: a request of another tenant let in, or one of the
   batch's own refused (a pointer comparison: tenant-less requests still meet, since
   ``request_tenant`` gives them all one ``""`` literal), each named; a cause (a prefix comparison,
   a test the wrong way round) only where the answers single it out. The model is unloaded
   (``ModelBatcherFinalize``) after each load and the server must still serve.

Both builds carry AddressSanitizer (:mod:`lab_backends.server.sanitizer`) and the server runs with its
runtime preloaded, as for notebooks 09 and 09c; every request has a deadline
(:data:`~lab_backends.lessons.native_faults.REQUEST_DEADLINE_S`). A memory error (a tenant copied into a
block one byte short, a free of the request's own text) stops the server at the first bad access and
is named with its kind and the learner's line (:func:`~lab_backends.lessons.native_faults.named`),
where glibc used to notice it later, or never.

Not checked, because Triton 2.51 never shows it: a batch that keeps the request's pointer to its
tenant instead of a copy. The batch's state is finalized before the batch is handed to an instance
(core ``dynamic_batch_scheduler.cc`` 430-437 at r24.10), so before any of its requests can be released,
and started afresh whenever a request leaves the queue (``scheduler_utils.cc`` 410 and 432-433;
``dynamic_batch_scheduler.cc`` 502-508): the kept pointer is never read after its request is released
(AddressSanitizer would have nothing to report either). A kept pointer that is then freed as if it were a copy
crashes the server, which step 3 reports.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons import batch_strategy, native_faults, strategy_calls
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.lessons.exercises.tenant_offers import LOGGED_TRIES, Offer, judge, missing, offers_in
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import crash, sanitizer
from lab_backends.server.repository import read_config
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll

NAME = "one_tenant_per_batch"
MODEL = "scheduler_probe"
HANDOUT = handout(NAME)
#: The skeleton as shipped (the learner edits a copy: ``exercises/tenant_batching.c`` next to notebook 09b).
SKELETON = HANDOUT.shipped
NOT_ATTEMPTED = ("complete the three TODO(exercise) places in exercises/tenant_batching.c, next to this notebook "
                 "(the marks may stay), save it, then run this cell again")
TASK = (
    "Complete exercises/tenant_batching.c (next to notebook 09b), a custom batching strategy: a batch holds "
    "the requests of one tenant only. A request's tenant is its string request parameter 'tenant' "
    "(parameters={'tenant': 'red'}); a request without one belongs to tenant \"\" (a group of its own). "
    "ModelBatchInitialize sets up a new batch's state, ModelBatchIncludeRequest says whether the next queued "
    "request joins (the first request of a batch always does, and decides its tenant), ModelBatchFinalize "
    "frees what the batch allocated. Then call exercises.check('one_tenant_per_batch', "
    "'exercises/tenant_batching.c'). The checker reads your frees, builds the file with -Wall -Wextra -Werror "
    "-Wl,-z,defs and AddressSanitizer, loads it on scheduler_probe on a server of its own, sends a burst of "
    "requests of several tenants and checks every batch in the trace, then loads it wrapped in the call log and "
    "reads what your IncludeRequest answered for each request offered to a batch that already held one."
)
#: The tenants of one burst, in runs (None: no tenant parameter). "redwood" starts with "red".
RUNS = (("red", 4), ("redwood", 3), ("blue", 5), (None, 3), ("red", 3), ("redwood", 4), (None, 2),
        ("blue", 4), ("red", 5), ("redwood", 3))
#: Milliseconds per batch of the traced burst (scheduler_probe's fixed_ms).
BURST_MS = 25
#: The bursts on the call-logging build: runs of 3 of each kind of tenant, and batches slow enough
#: (LOGGED_MS each) that the burst queues behind the first batches, so requests of one tenant are offered
#: to a batch of their own, 'redwood' to a batch of 'red', and 'blue' to one of no tenant (every offer is
#: logged with what the strategy answered). The lead-in pair runs first (one alone on the idle instance,
#: one prefetched alone while it runs: core dynamic_batch_scheduler.cc 367), before the rest has arrived.
LOGGED_RUNS = (("blue", 2), ("red", 3), ("redwood", 3), (None, 3), ("blue", 3))
LOGGED_MS = 60
#: Sent this far apart, the requests reach the queue in the order sent (all at once, gRPC's threads
#: reorder them: 13, 9, 14, 12, 2, ... in one burst), so a run of one tenant waits in the queue together.
LOGGED_GAP_S = 0.003
#: Every request's deadline: a strategy that hangs or corrupts the server gets a verdict, not a wait for ever.
ANSWER_TIMEOUT_S = native_faults.REQUEST_DEADLINE_S
#: What to look for when the strategy corrupted memory (named by native_faults.named, with the line).
FAULT_ADVICE = ("Check every pointer before use (a request without a 'tenant' parameter: request_tenant gives \"\" "
                "then), copy a tenant into strlen + 1 bytes (strdup does), free only what your strategy allocated "
                "(the request's tenant text is the request's), and never use a batch's state after "
                "ModelBatchFinalize freed it")


def tenants() -> list[str | None]:
    return [tenant for tenant, count in RUNS for _ in range(count)]


def read_answer(answer: Any) -> tuple[Path, str]:
    """The learner's C file and its text; ``NotImplementedError`` while it is the skeleton as shipped.

    Compared with the package's copy, so a file edited in place, as notebook 09b says, is judged as
    what it now is (comparing with the path being edited called every edit "not attempted").
    """
    return read_c_answer(answer, HANDOUT, "09b", NOT_ATTEMPTED)


@exercise(NAME, notebook="09b_batching_strategy_in_c", task=TASK, models=())
def check_tenant_strategy(answer: Any, server: Any = None) -> str:
    """Read, build, load and drive the learner's strategy on a server of its own (``server`` is unused)."""
    del server  # a strategy runs inside tritonserver: a crash must not take the learner's server down
    path, source = read_answer(answer)
    faults = batch_strategy.allocation_faults(source)
    if faults:
        raise ExerciseError(f"{path.name}: {faults[0]}. ModelBatchFinalize must free what the batch allocated, "
                            "the copy of its tenant included")
    with tempfile.TemporaryDirectory(prefix="exercise-tenant-") as tmp:
        try:
            library = batch_strategy.build(tmp, path, "tenant_batching", ("-Werror", *sanitizer.COMPILE_FLAGS))
        except BackendBuildError as exc:
            raise ExerciseError(f"your {path.name} does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n"
                                f"{exc}") from exc
        try:
            logged = strategy_calls.build(tmp, wrapped=path, extra_flags=sanitizer.COMPILE_FLAGS)
        except BackendBuildError as exc:
            raise ExerciseError(f"your {path.name} builds alone but not inside the call log that the checker wraps "
                                "it in (c_backends/batching/call_log/call_log.c #includes it after renaming the five "
                                "functions): do not use the names CALL_LOG or wrapped_*, nor redefine the five "
                                f"functions' names:\n{exc}") from exc
        base = read_config(MODEL_REPOSITORY / MODEL)
        with (TritonServer(models=[], trace_file=Path(tmp) / "trace.json", trace_log_frequency=1,
                           target="local", exit_timeout_s=2, address_sanitizer=True) as own,
              native_faults.named(own, path.name, FAULT_ADVICE)):
            mixed, table = _traced_burst(own, batch_strategy.with_strategy(base, library, fixed_ms=BURST_MS))
            offers = _logged_offers(own, batch_strategy.with_strategy(base, logged, fixed_ms=LOGGED_MS))
            _still_alive(own, "after the model was unloaded (ModelBatcherFinalize)")
    fault = judge(offers, mixed)
    if fault:
        raise ExerciseError(fault)
    joined = [o for o in offers if o.same and o.tenant]
    return (f"{path.name} built with -Werror; {int(table['size'].sum())} requests of 4 tenants ran in {len(table)} "
            f"batches (largest {int(table['size'].max())} requests), every batch of one tenant; logged: each "
            f"of the {len(joined)} requests offered to a batch of their own named tenant joined it, each of the "
            f"{sum(not o.same for o in offers)} of another tenant was refused; unloaded cleanly.")


def _traced_burst(own: Any, config: Any) -> tuple[str, pd.DataFrame]:
    """One burst of :data:`RUNS` on the plain build: answered, alive, and every batch from the trace.

    Run before the logged build because a strategy that refuses a batch's first request makes the
    batcher spin, and the call log would then write a line per spin. Returns the first mixed batch
    described (``""``: none) and the batch table.
    """
    try:
        own.load_model(MODEL, config=config)
    except ModelLoadError as exc:
        raise ExerciseError(f"scheduler_probe did not load with your strategy: {exc.reason}") from exc
    who = tenants()
    prefix = "tenant"
    inputs = [{"INPUT0": np.full((1, 4), i, np.float32)} for i in range(len(who))]
    params = [{"tenant": t} if t is not None else None for t in who]
    answers = batch_strategy.tagged_burst(own, MODEL, inputs, params, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S)
    _all_answered(own, answers, who)
    table = batch_strategy.batch_table(own, MODEL, answers)
    of = {f"{prefix}-{i}": ("(none)" if t is None else t) for i, t in enumerate(who)}
    mixed = ""
    for row in table.itertuples():
        counts = pd.Series([of[rid] for rid in row.request_ids]).value_counts()
        if len(counts) > 1:
            mixed = (f"a batch of {row.size} requests mixed tenants {dict(counts)} (requests "
                     f"{', '.join(row.request_ids[:6])})")
            break
    _unload(own)
    return mixed, table


def _logged_offers(own: Any, config: Any) -> list[Offer]:
    """Bursts of :data:`LOGGED_RUNS` on the call-logging build until the offers show all that :func:`missing`
    asks for (at most :data:`LOGGED_TRIES` bursts); every offer the strategy answered.

    Each batch takes :data:`LOGGED_MS` and the requests leave :data:`LOGGED_GAP_S` apart, so runs of one
    tenant wait in the queue together, in order. The evidence is what the strategy itself answered for
    each request it was offered, not which requests happened to meet (measured in 24 checks of correct
    answers over four audits, one beside two busy loops: 5 to 7 offers of a named tenant to its own
    batch and 3 or 4 of other tenants, every kind :func:`missing` asks for seen each time).
    """
    start = len(own.log_text())
    try:
        own.load_model(MODEL, config=config)
    except ModelLoadError as exc:
        raise ExerciseError(f"scheduler_probe did not load with your strategy: {exc.reason}") from exc
    who = [tenant for tenant, count in LOGGED_RUNS for _ in range(count)]
    tenant_of: dict[str, str] = {}
    offers: list[Offer] = []
    for attempt in range(LOGGED_TRIES):
        prefix = f"logged{attempt}"
        inputs = [{"INPUT0": np.full((1, 4), i, np.float32)} for i in range(len(who))]
        params = [{"tenant": t} if t is not None else None for t in who]
        answers = batch_strategy.tagged_burst(own, MODEL, inputs, params, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S,
                                              gap_s=LOGGED_GAP_S)
        _all_answered(own, answers, who)
        tenant_of.update({f"{prefix}-{i}": t or "" for i, t in enumerate(who)})
        # Every answered request was offered before it ran: its line is in the log by now.
        offers, _ = offers_in(own.log_text()[start:], tenant_of)
        if not missing(offers):
            break
    _unload(own)
    offers, _ = offers_in(own.log_text()[start:], tenant_of)
    return offers


def _unload(own: Any, timeout_s: float = 30.0) -> None:
    """Unload the model and wait until Triton says it is gone (core ``model_lifecycle.cc`` L624 at r24.10):
    a load of the same model while the old instances were still going down once hung for good
    (:func:`~lab_backends.lessons.strategy_calls.counted`)."""
    start = len(own.log_text())
    own.unload_model(MODEL)
    done = f"successfully unloaded '{MODEL}'"
    poll(lambda: own.log_text()[start:], lambda t: done in t or crash.crashed(own) is not None, timeout_s)
    _still_alive(own, "when the model was unloaded (ModelBatchFinalize, ModelBatcherFinalize)")


def _all_answered(own: Any, answers: pd.DataFrame, who: list[str | None]) -> None:
    """Raise when a request went unanswered or failed. A crash, an ASan report or a server stuck in its
    signal handler is named by :func:`~lab_backends.lessons.native_faults.named` around the whole check."""
    if answers["ok"].all():
        return
    # A dead server's requests fail at once ("Socket closed"), a moment before its exit is seen: wait for
    # the exit, so that native_faults reads the finished report rather than "a request failed".
    refused = ~answers["ok"] & ~answers["error"].str.startswith("no answer")
    if poll(lambda: crash.crashed(own), lambda c: c is not None, 5.0 if refused.any() else 0.0) is not None:
        raise ExerciseError("tritonserver died while your strategy formed batches")
    silent = answers[answers["error"].str.startswith("no answer")]
    if len(silent):
        first = who[int(silent.index[0])]
        raise ExerciseError(
            f"{len(silent)} of {len(answers)} requests were never answered (the first: "
            f"{'no tenant' if first is None else 'tenant ' + repr(first)}): when IncludeRequest refuses the first "
            "request of an empty batch, the batcher asks about it again, forever. Always include a batch's first "
            "request, whatever its tenant")
    failed = answers.loc[~answers["ok"], "error"].iloc[0]
    raise ExerciseError(f"a request failed: {failed}")


def _still_alive(own: Any, when: str) -> None:
    code = crash.crashed(own)
    if code is not None:
        raise ExerciseError(f"tritonserver died {when}: {crash.log_cause(own.log_text(), code) or code}; "
                            "ModelBatcherFinalize must free only what ModelBatcherInitialize allocated")
