"""Count the calls Triton makes to a batching strategy, on a real server (notebook 09b, section 4).

The five functions of a strategy come in pairs: ``BatcherInitialize``/``BatcherFinalize`` once per
load, ``BatchInitialize``/``BatchFinalize`` once per batch (core ``include/triton/core/tritonbackend.h``
1710-1767 at r24.10), and a strategy frees in a Finalize what it allocated in the Initialize. Whether
Triton 2.51 calls them in pairs is a question for the server: ``c_backends/batching/call_log/call_log.c``
wraps a strategy (``byte_budget.c`` unless told otherwise), logs every call with the pointers it
returns and receives, and behaves exactly like the wrapped one. :func:`count_calls` reads those log
lines back and pairs each tally a ``BatchInitialize`` returned with the ``BatchFinalize`` that
received it: the pointers are the strategy's own and Triton only passes them back, and an address
can be handed out again only after it was freed, so pairing them in log order is exact.

What it measured on Triton 2.51 (tests/test_batch_strategy.py pins it): every load leaves one tally
never finalized (the batch still forming when the model unloads: the scheduler's destructor,
``src/dynamic_batch_scheduler.cc`` 174-182, only stops its thread), and every batch the batcher
resumed leaves one more (its last tally: the batch is never sent again, 430-436, and the next one
replaces it, 343-346).

:func:`counted` runs one experiment and unloads the model, waiting for ``BatcherFinalize`` in the
log, so the lines it reads belong to that load alone.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from lab_backends.errors import MeasuredClaimError
from lab_backends.lessons import batch_strategy
from lab_backends.server import cbackend
from lab_backends.waiting import poll

NAME = "call_log"
SOURCE = cbackend.STRATEGIES_DIR / NAME / f"{NAME}.c"
#: Every line of the wrapper starts with this (``CALL_LOG`` in call_log.c).
TAG = "batch call log: "
_LINE = re.compile(r"batch call log: (\w+) (?:\S+=\S+ -> )?(?:\w+=)?(\S+)")
T = TypeVar("T")


def build(strategy_dir: str | Path, wrapped: str | Path = batch_strategy.SOURCE,
          extra_flags: Sequence[str] = ()) -> Path:
    """The call-logging build of ``wrapped`` (a strategy's C source), as ``<strategy_dir>/libcall_log.so``;
    ``extra_flags`` as the exercise's AddressSanitizer flags (the wrapped file's lines keep its own name)."""
    wrapped = Path(wrapped).resolve()
    flags = () if wrapped == batch_strategy.SOURCE.resolve() else (f'-DLAB_WRAPPED_STRATEGY="{wrapped}"',)
    return cbackend.build_strategy(SOURCE, NAME, strategy_dir, extra_flags=(*flags, *extra_flags))


@dataclass(frozen=True)
class CallCounts:
    """How many times Triton called each function, and what became of the tallies."""

    batcher_initialize: int
    batch_initialize: int
    include_request: int
    batch_finalize: int
    batcher_finalize: int
    #: Tallies a BatchInitialize returned that no BatchFinalize received.
    never_finalized: int
    #: BatchFinalize calls on a pointer that no unfinalized BatchInitialize had returned (a double free).
    unknown_finalized: int

    def as_dict(self) -> dict[str, int]:
        return {name.replace("_", " "): value for name, value in asdict(self).items()}


def count_calls(log_text: str) -> CallCounts:
    """The calls logged by the call_log wrapper in ``log_text`` (one load's worth: see :func:`counted`)."""
    counts = {"BatcherInitialize": 0, "BatchInitialize": 0, "BatchIncludeRequest": 0, "BatchFinalize": 0,
              "BatcherFinalize": 0}
    live: set[str] = set()
    unknown = 0
    for line in log_text.splitlines():
        if TAG not in line:
            continue
        match = _LINE.search(line)
        if match is None or match.group(1) not in counts:
            raise MeasuredClaimError(f"a call_log line this reader does not know: {line!r}")
        function, pointer = match.groups()
        counts[function] += 1
        if function == "BatchInitialize" and pointer != "(nil)":
            live.add(pointer)
        elif function == "BatchFinalize":
            if pointer in live:
                live.remove(pointer)
            else:
                unknown += 1
    return CallCounts(counts["BatcherInitialize"], counts["BatchInitialize"], counts["BatchIncludeRequest"],
                      counts["BatchFinalize"], counts["BatcherFinalize"], len(live), unknown)


def counted(server: Any, model: str, experiment: Callable[[], T], timeout_s: float = 30.0) -> tuple[T, CallCounts]:
    """Run ``experiment`` (it loads ``model`` with the call_log strategy and sends), unload ``model``,
    and count the calls logged meanwhile. ``model`` stays unloaded: load it again to use it.

    The model must not be loaded with the call_log strategy already (its unload would log into this
    count). Returns once the unload has finished: ``BatcherFinalize`` logged, and Triton's "successfully
    unloaded" (core ``model_lifecycle.cc`` L624 at r24.10, logged when the model object is destroyed, its
    instances and stubs with it). The unload call returns before that, and a load of the same model while
    the old instances were still going down once lost its new stub's shared-memory region (the stub:
    "Unable to initialize shared memory key ... No such file or directory"): that load hung for good
    (a fresh clone's ``make test`` beside a one-core hog, 2026-12-04).
    """
    start = len(server.log_text())
    result = experiment()
    server.unload_model(model)
    done = (f"{TAG}BatcherFinalize", f"successfully unloaded '{model}'")
    text = poll(lambda: server.log_text()[start:], lambda t: all(line in t for line in done), timeout_s)
    if done[0] not in text:
        raise MeasuredClaimError(f"'{model}' did not log BatcherFinalize within {timeout_s:g} s of its unload: "
                                 f"was it loaded with the call_log strategy? (log: {server.log_path})")
    if done[1] not in text:
        raise MeasuredClaimError(f"'{model}' was not unloaded within {timeout_s:g} s (log: {server.log_path})")
    return result, count_calls(text)
