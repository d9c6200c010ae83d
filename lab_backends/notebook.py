"""Small things every notebook needs: the size switch and a printed check mark.

``LAB_FAST=1`` (set by CI and by impatient learners) shrinks loads and repeat counts so that a
notebook runs top to bottom in seconds; the lessons and the assertions stay the same.
"""

from __future__ import annotations

import builtins
import os
import sys
from typing import Any, Callable, NamedTuple, TypeVar

from lab_backends.errors import MeasuredClaimError

T = TypeVar("T")

#: True when ``LAB_FAST=1``: notebooks shrink their loads.
FAST = os.environ.get("LAB_FAST", "0") == "1"

#: True when ``LAB_PATIENT=1`` (``make book`` sets it): run the demonstrations that wait out a real
#: clock (a minute or more, e.g. the metrics summary window), which the test run must not pay for.
PATIENT = os.environ.get("LAB_PATIENT", "0") == "1"


def sized(full: T, fast: T) -> T:
    """``fast`` under ``LAB_FAST=1``, else ``full``: ``repeats = sized(50, 10)``."""
    return fast if FAST else full


def check(condition: bool, lesson: str) -> None:
    """Assert what a notebook teaches, and say so when it holds (a silent assert teaches nothing)."""
    if not condition:
        raise AssertionError(f"expected, but not observed on this server: {lesson}")
    print(f"✓ {lesson}")


#: How much longer the second (and last) measurement of a timing claim runs.
REMEASURE_FACTOR = 2.0
#: The window of a forced re-measurement (``LAB_FORCE_REMEASURE=1`` while the first round held): the first one's.
FORCED_FACTOR = 1.0


def forced_remeasure() -> bool:
    """True when ``LAB_FORCE_REMEASURE=1``: every timing claim re-measures as if its first try missed.

    Why: a claim's ``remeasure`` runs only when a bound is missed on a busy machine, so a fault in it
    (a name never imported) would wait for a learner's slow day. Tests set this to run every such
    fallback on a quiet machine; the bounds stay the same. Read at each call (a test may set it late).
    """
    return os.environ.get("LAB_FORCE_REMEASURE", "0") == "1"


def stretched(load: dict, factor: float) -> dict:
    """A load's keyword arguments with its request count and time window multiplied by ``factor``.

    Why: a re-measurement must run the same experiment, only longer, so that a burst of foreign
    CPU load averages out; changing anything else would test a different claim.
    """
    longer = dict(load)
    for key in ("requests", "duration_s"):
        if key in longer:
            longer[key] = type(longer[key])(longer[key] * factor)
    return longer


def measure_rounds(first: T, missed: Callable[[T], bool], remeasure: Callable[[float], T] | None) -> list[T]:
    """Every measurement of one experiment, the first given: one re-measure on a miss, the last decides.

    Why one place: a notebook's timing claims (``check_claims``) and an exercise checker's bounds
    (03's ``tune_the_batcher``) get the same bounded retry. ``missed(first)`` true: ``remeasure``
    runs once over a ``REMEASURE_FACTOR`` longer window. ``LAB_FORCE_REMEASURE=1`` with a first
    round that held: it runs over the same window (``FORCED_FACTOR``), and if that forced round
    misses it gets the one retry a real miss gets, so forcing adds no flakiness.
    """
    rounds = [first]
    real = missed(first)
    if remeasure is None or not (real or forced_remeasure()):
        return rounds
    # Forced (the first round held): the same code over the first round's window, at half a real retry's cost.
    factor = REMEASURE_FACTOR if real else FORCED_FACTOR
    why = "the machine may be busy" if real else "LAB_FORCE_REMEASURE=1"
    print(f"… {why}: re-measuring once over a {factor:g}x window")
    rounds.append(remeasure(factor))
    if not real and missed(rounds[-1]):
        print(f"… the forced re-measurement missed: re-measuring once more over a {REMEASURE_FACTOR:g}x window")
        rounds.append(remeasure(REMEASURE_FACTOR))
    return rounds


class Claim(NamedTuple):
    """One claim about a measured quantity: ``above < value(data) < below`` (either bound optional)."""

    lesson: str
    value: Callable[[Any], float]
    above: float | None = None
    below: float | None = None
    what: str = "measured"

    def bound(self) -> str:
        parts = ([f"> {self.above:g}"] if self.above is not None else []) + (
            [f"< {self.below:g}"] if self.below is not None else [])
        return " and ".join(parts)

    def holds(self, x: float) -> bool:
        return (self.above is None or x > self.above) and (self.below is None or x < self.below)


def check_measured(
    lesson: str,
    data: T,
    value: Callable[[T], float],
    *,
    above: float | None = None,
    below: float | None = None,
    remeasure: Callable[[float], T] | None = None,
    what: str = "measured",
) -> T:
    """Check one claim about a MEASURED quantity (see ``check_claims``); return the data it held on."""
    return check_claims(data, [Claim(lesson, value, above, below, what)], remeasure=remeasure)


def check_claims(data: T, claims: list[Claim], *, remeasure: Callable[[float], T] | None = None) -> T:
    """Check timing claims that share one measurement; return the data they all held on.

    Why not ``check``: a timing can miss its bound because another program took the CPU, and a bare
    "not observed" cannot be told apart from a broken lesson. So each claim prints what was expected
    and what was measured; when any bound is missed, ``remeasure(REMEASURE_FACTOR)`` runs the same
    experiment over a longer window and EVERY claim is checked again on that one new measurement,
    with the same bounds. Only a second miss fails, with both numbers and what to do. The bounds are
    never relaxed: the retry buys time, not slack.
    """
    for claim in claims:
        if claim.above is None and claim.below is None:
            raise ValueError(f"claim {claim.lesson!r} needs a bound: pass above=..., below=... or both")
    values = [[float(c.value(data)) for c in claims]]
    for claim, x in zip(claims, values[0]):
        if not claim.holds(x) and remeasure is not None:
            print(f"… {claim.lesson}: expected {claim.what} {claim.bound()}, measured {x:.3g}")
    measured = measure_rounds(data, lambda d: not all(c.holds(float(c.value(d))) for c in claims), remeasure)
    data = measured[-1]
    rounds = values + [[float(c.value(d)) for c in claims] for d in measured[1:]]
    last = rounds[-1]
    failures = [i for i, (c, x) in enumerate(zip(claims, last)) if not c.holds(x)]
    if not failures:
        for claim, x in zip(claims, last):
            print(f"✓ {claim.lesson}  (expected {claim.what} {claim.bound()}, measured {x:.3g})")
        return data
    lines = []
    for i in failures:
        tries = ", then ".join(f"{r[i]:.3g}" for r in rounds)
        lines.append(f"expected, but not observed on this server: {claims[i].lesson}\n"
                     f"  expected {claims[i].what} {claims[i].bound()}; measured {tries}")
    retried = f" (after the first, over a {REMEASURE_FACTOR:g}x longer window)" if len(rounds) > 1 else ""
    raise MeasuredClaimError(
        "\n".join(lines) + f"{retried}.\n"
        "  This is a timing claim: the machine may be busy (another notebook, a build, a browser tab "
        "using the CPU). Check with `top`, close what competes, then re-run this cell and the ones "
        "above it from the measurement on (Run > Run Selected Cell and All Below). If it still fails "
        "on a quiet machine, the lesson is broken: please report it with this message."
    )


#: What the front door answers while tritonserver restarts behind it (server/door_config.py: HTTP 503,
#: gRPC UNAVAILABLE): the words a call's error then holds, whichever client made it.
RESTARTING = "not answering behind the front door"


def ipython_shell() -> Any:
    """This kernel's IPython shell, or None outside IPython.

    IPython puts ``get_ipython`` among the builtins only while a cell's code runs; its event callbacks
    (``pre_run_cell``, where the class's limit notices are installed) run outside that, so the loaded
    IPython module is asked too.
    """
    found = getattr(builtins, "get_ipython", None)
    if found is None and "IPython" in sys.modules:
        found = sys.modules["IPython"].get_ipython
    return found() if found is not None else None


def explain(explainer: Callable[[BaseException], str | None]) -> bool:
    """In a notebook kernel: an error ``explainer`` recognizes prints its one line instead of a traceback.

    IPython keeps one custom exception handler per shell (``set_custom_exc``), so every explainer
    goes through one handler installed here: the first explainer that returns text for the error
    prints it (stderr, red in the notebook) and the traceback is not shown; every other error shows
    as IPython shows it. Registered once per explainer per kernel; outside IPython it does nothing
    and returns False (also when this explainer was already registered).
    """
    shell = ipython_shell()
    if shell is None:
        return False
    explainers = getattr(shell, "_lab_explainers", None)
    if explainers is None:
        explainers = shell._lab_explainers = []

        def handler(self: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> Any:
            for explain_one in explainers:
                line = explain_one(value)
                if line:
                    print(line, file=sys.stderr)
                    return None
            return self.showtraceback((etype, value, tb), tb_offset=tb_offset)

        shell.set_custom_exc((Exception,), handler)
    if explainer in explainers:
        return False
    explainers.append(explainer)
    return True


def _restarting(value: BaseException) -> str | None:
    if RESTARTING in str(value):
        return ("the shared server is restarting after a crash (its front door says so): run this cell again "
                "in a few seconds")
    return None


def explain_restarts() -> bool:
    """In a notebook kernel: an error that says the shared server is restarting prints one line, not a traceback.

    A class's shared Triton restarts after a crash (``serve --restart``) while its front door holds the
    ports and answers every call meanwhile with :data:`RESTARTING`. A learner's cell then fails through
    no fault of theirs; they should read what happened and what to do (run it again), not tritonclient's
    stack. Registered (:func:`explain`) by the remote target when a lesson reaches a shared server.
    """
    return explain(_restarting)
