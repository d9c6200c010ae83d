"""Notebook 09b's exercise (``one_tenant_per_batch``): a batching strategy in C that never mixes tenants.

The learner completes ``exercises/tenant_batching.c`` next to the notebook, in place (handed out by
set-up: :mod:`lab_backends.lessons.handout`); the checker does what a reviewer and a test server would, in the order a
learner fixes things:

1. reads the source: the skeleton as shipped (the package's copy, never the file being edited) ->
   "not attempted"; then what it frees
   (:func:`~lab_backends.lessons.batch_strategy.allocation_faults`): a ``ModelBatchFinalize`` that
   does not free what ``ModelBatchInitialize``/``IncludeRequest`` allocated leaks once per batch;
2. builds it with ``gcc -Wall -Wextra -Werror -Wl,-z,defs``, all five entry points exported;
3. loads it on ``scheduler_probe`` (one instance, 25 ms per batch, so a burst queues) on a server
   *of its own* (a strategy runs inside tritonserver: a NULL dereference kills the server, which
   must not be the learner's), sends bursts of requests of four tenants in runs (``red``,
   ``redwood``, ``blue`` and no tenant), and rebuilds every batch from the trace: a batch holding two
   tenants, a request never answered (the batcher spins on a request the strategy refuses at the
   head of an empty batch: core ``src/dynamic_batch_scheduler.cc`` 564-571 and 605-609 at r24.10),
   a crash, or batches that never hold more than one request are each refused with the fault
   named; finally the model is unloaded (``ModelBatcherFinalize``) and the server must still serve.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab_backends.errors import BackendBuildError, ExerciseError, ModelLoadError
from lab_backends.lessons import batch_strategy
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.lessons.handout import handout, read_c_answer
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import crash
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
    "-Wl,-z,defs, loads it on scheduler_probe on a server of its own, sends bursts of requests of several "
    "tenants and checks every batch in the trace."
)
#: The tenants of one burst, in runs (None: no tenant parameter). "redwood" starts with "red".
RUNS = (("red", 4), ("redwood", 3), ("blue", 5), (None, 3), ("red", 3), ("redwood", 4), (None, 2),
        ("blue", 4), ("red", 5), ("redwood", 3))
BURST_TRIES = 3
ANSWER_TIMEOUT_S = 10.0


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
            library = batch_strategy.build(tmp, path, "tenant_batching", ("-Werror",))
        except BackendBuildError as exc:
            raise ExerciseError(f"your {path.name} does not build with -Wall -Wextra -Werror -Wl,-z,defs:\n"
                                f"{exc}") from exc
        base = read_config(MODEL_REPOSITORY / MODEL)
        config = batch_strategy.with_strategy(base, library, fixed_ms=25)
        with TritonServer(models=[], trace_file=Path(tmp) / "trace.json", trace_log_frequency=1,
                          target="local", exit_timeout_s=2) as own:
            try:
                own.load_model(MODEL, config=config)
            except ModelLoadError as exc:
                raise ExerciseError(f"scheduler_probe did not load with your strategy: {exc.reason}") from exc
            seen = _bursts(own)
            own.unload_model(MODEL)
            _still_alive(own, "after the model was unloaded (ModelBatcherFinalize)")
    batches, requests, largest = seen
    return (f"{path.name} built with -Werror; {requests} requests of 4 tenants ran in {batches} batches (largest "
            f"{largest} requests), every batch of one tenant, tenant-less requests apart; unloaded cleanly.")


def _bursts(own: Any) -> tuple[int, int, int]:
    """Up to BURST_TRIES bursts until one batch holds several requests; every batch must be one tenant's."""
    batches = requests = largest = 0
    who = tenants()
    for attempt in range(BURST_TRIES):
        prefix = f"tenant{attempt}"
        inputs = [{"INPUT0": np.full((1, 4), i, np.float32)} for i in range(len(who))]
        params = [{"tenant": t} if t is not None else None for t in who]
        answers = batch_strategy.tagged_burst(own, MODEL, inputs, params, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S)
        _all_answered(own, answers, who)
        table = batch_strategy.batch_table(own, MODEL, answers)
        of = {f"{prefix}-{i}": ("(none)" if t is None else t) for i, t in enumerate(who)}
        for row in table.itertuples():
            mixed = pd.Series([of[rid] for rid in row.request_ids]).value_counts()
            if len(mixed) > 1:
                raise ExerciseError(
                    f"a batch of {row.size} requests mixed tenants {dict(mixed)} (requests "
                    f"{', '.join(row.request_ids[:6])}): IncludeRequest must refuse a request whose tenant is not "
                    "the batch's first one (compare the whole text with strcmp; no tenant is tenant \"\")"
                    + prefix_hint(list(mixed.index)))
        batches, requests = batches + len(table), requests + len(answers)
        largest = max(largest, int(table["size"].max()))
        if largest > 1:
            return batches, requests, largest
    raise ExerciseError(
        f"after {BURST_TRIES} bursts of {len(who)} requests (runs of 2 to 5 of one tenant) every batch held one "
        "request: requests of the same tenant must share a batch. Compare the tenants' text (strcmp), not "
        "their pointers, and keep including while the tenant matches")


def prefix_hint(mixed: list[str]) -> str:
    """When one tenant of a mixed batch begins every other one ('red' and 'redwood'; no tenant, "", begins
    all): what a comparison of only the first tenant's length would let in. Which tenant opens a batch
    depends on arrival order, so the same fault shows as 'red' + 'redwood' in one run, "" + 'blue' in another."""
    names = ["" if t == "(none)" else t for t in mixed]
    short = min(names, key=len)
    if not all(n.startswith(short) for n in names):
        return ""
    shown = "(no tenant)" if short == "" else repr(short)
    return (f"; {shown} is a prefix of the others: a comparison of only as many characters as the batch's "
            "tenant has (strncmp with its strlen) lets them in")


def _all_answered(own: Any, answers: pd.DataFrame, who: list[str | None]) -> None:
    if answers["ok"].all():
        return
    # A dead server's requests fail at once ("Socket closed"), a moment before its exit is seen.
    refused = ~answers["ok"] & ~answers["error"].str.startswith("no answer")
    code = poll(lambda: crash.crashed(own), lambda c: c is not None, 5.0 if refused.any() else 0.0)
    if code is not None:
        cause = crash.log_cause(own.log_text(), code) or crash.describe_exit(code)
        raise ExerciseError(
            f"tritonserver died while your strategy formed batches ({cause}): a strategy runs inside the "
            "server, so a bad pointer kills it. Check every pointer before use, e.g. a request without a "
            "'tenant' parameter (request_tenant gives \"\" then) or a NULL batch")
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
