"""The requests that judge a learner's native digits backend on a server of its own (09c and 09d).

Notebooks 09c (``tf_gather_scatter``) and 09d (``executorch_binding``) hand the learner one part of a
framework backend and serve it, built with the rest, beside the backend's own build as the reference.
Both then ask the same questions of it, in the same order: one request alone, then bursts of
concurrent requests until one execution held several (so rows are gathered and scattered at offsets),
every answer compared with the reference's logits. What differs is the learner's words for what to fix:
each checker gives its :class:`Hints` and may say more about wrong values (:meth:`ServedProbe.wrong_values`).

Every request has a deadline (:data:`native_faults.REQUEST_DEADLINE_S`); a failed request on a server
that faulted gets the fault's verdict (:func:`native_faults.fault`), a deadline that passed on a server
with no fault gets :attr:`Hints.hang`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.errors import ExerciseError
from lab_backends.lessons.authoring import send_together
from lab_backends.lessons.native_faults import REQUEST_DEADLINE_S, fault
from lab_backends.measure.stats import batch_rows
from lab_backends.waiting import poll

TOLERANCE = 1e-4
#: Bursts sent at most until one execution held several requests.
BURST_TRIES = 4
#: How long a burst's batch records may lag its answers (one hand-off inside the server; bounded).
STATS_WAIT_S = 5.0


@dataclass(frozen=True)
class Counts:
    """A model's ``execution_count`` and the rows its batch records hold (``batch_stats``: size x count)."""

    executions: int
    rows: int


@dataclass(frozen=True)
class Hints:
    """What one exercise tells the learner to look at, after each kind of failure."""

    reference: str  #: the model whose answers are right ("digits_et")
    runs: str    #: what of theirs runs inside the server ("your backend", "your binding")
    crash: str   #: after a memory fault or a crash: where such a fault comes from
    hang: str    #: after a deadline with no fault: what never returned
    failed: str  #: after a request's own error
    shape: str   #: after an answer of the wrong shape


def reference_logits(own: Any, model: str, pixels: np.ndarray) -> np.ndarray:
    """``model``'s logits for every row of ``pixels`` (requests of 64 rows, each with its deadline)."""
    return np.concatenate([infer(own, model, {"PIXELS": pixels[i:i + 64]}, client_timeout=REQUEST_DEADLINE_S)["LOGITS"]
                           for i in range(0, len(pixels), 64)])


class ServedProbe:
    """Requests to the learner's ``model`` on ``own``; ``want``: the reference's logits for ``pixels``;
    ``sources``: the learner's file name, then the rest of the backend's (a fault's report is searched
    for them)."""

    def __init__(self, own: Any, model: str, pixels: np.ndarray, want: np.ndarray, sources: tuple[str, ...],
                 hints: Hints) -> None:
        self.own, self.model, self.pixels, self.want = own, model, pixels, want
        self.sources, self.hints = sources, hints

    def died(self, when: str, failure: Any = None) -> None:
        """Raise the verdict when the server faulted, or when ``failure`` (a request's error) is a deadline
        that passed on a server that shows no fault."""
        found = fault(self.own, self.sources)
        if found is not None and any(f" at {name}:" in found for name in self.sources[1:]):
            found += " (the rest of the backend, built with your file: it tripped over what your code left)"
        if found is not None:
            raise ExerciseError(f"{found} {when}: {self.hints.runs} runs inside the server. {self.hints.crash}")
        if failure is not None and ("DEADLINE_EXCEEDED" in str(failure) or isinstance(failure, TimeoutError)):
            raise ExerciseError(f"no answer {when} within {REQUEST_DEADLINE_S:.0f} s, and the server shows no crash: "
                                f"{self.hints.hang}")

    def compare(self, got: Any, start: int, rows: int, what: str, batched: bool) -> None:
        """``got`` (LOGITS or the request's exception) against the reference's rows ``start``..``start+rows``."""
        if isinstance(got, Exception):
            self.died(f"during {what}", got)
            message = got.message() if isinstance(got, InferenceServerException) else str(got)
            raise ExerciseError(f"{what} failed: {message}. {self.hints.failed}")
        want = self.want[start:start + rows]
        if got.shape != want.shape:
            raise ExerciseError(f"{what}: a request of {rows} row{'s' * (rows > 1)} got LOGITS of shape "
                                f"{list(got.shape)}, expected {list(want.shape)}. {self.hints.shape}")
        if np.abs(got - want).max() >= TOLERANCE:
            self.wrong_values(got, want, rows, what, batched)

    def wrong_values(self, got: np.ndarray, want: np.ndarray, rows: int, what: str, batched: bool) -> None:
        """Raise the verdict on logits that differ from the reference's (a checker may say more)."""
        del rows, batched
        diff = float(np.abs(got - want).max())
        raise ExerciseError(f"{what}: the logits differ from {self.hints.reference}'s by {diff:.3g}"
                            + (" (all zeros)" if np.abs(got).max() == 0 else "") + f". {self.hints.failed}")

    def alone(self, start: int, rows: int) -> None:
        """One request, nothing else in flight: a batch of one request."""
        try:
            got: Any = infer(self.own, self.model, {"PIXELS": self.pixels[start:start + rows]},
                             client_timeout=REQUEST_DEADLINE_S)["LOGITS"]
        except InferenceServerException as exc:
            got = exc
        self.compare(got, start, rows, f"one request of {rows} row{'s' * (rows > 1)} alone", batched=False)

    def together(self, requests: list[dict[str, np.ndarray]], what: str) -> list[Any]:
        """``send_together`` with every request's deadline; a burst that gets no answer is judged."""
        try:
            return send_together(self.own, self.model, requests, timeout_s=REQUEST_DEADLINE_S)
        except TimeoutError as exc:
            self.died(f"during {what}", exc)
            raise ExerciseError(str(exc)) from exc  # not reached: died() judges a timeout

    def counts(self) -> Counts:
        stats = self.own.statistics(self.model)["model_stats"][0]
        return Counts(int(stats["execution_count"]), batch_rows(stats))

    def counts_after(self, before: Counts, rows: int) -> Counts:
        """The counts once the batch records hold ``rows`` more rows than ``before`` (at most :data:`STATS_WAIT_S`).

        The backend sends a batch's answers in its scatter and reports the batch only afterwards
        (``report()`` in lab_tensorflow.c and lab_framework_steps.h), so an ``execution_count`` read
        when the client holds every answer can lack the last execution: a burst whose requests each ran
        alone would look batched, and an offset fault that shows only in a shared batch would pass.
        """
        return poll(self.counts, lambda now: now.rows - before.rows >= rows, STATS_WAIT_S)

    def bursts(self, burst_rows: tuple[int, ...]) -> int:
        """Bursts of requests of ``burst_rows`` rows until one execution held several requests (at most
        :data:`BURST_TRIES`), every answer compared; how many requests were sent."""
        sent = 0
        for attempt in range(BURST_TRIES):
            starts = [(37 * (attempt * len(burst_rows) + i)) % (len(self.pixels) - 8) for i in range(len(burst_rows))]
            before = self.counts()
            replies = self.together([{"PIXELS": self.pixels[s:s + n]} for s, n in zip(starts, burst_rows)],
                                    f"a burst of {len(burst_rows)} requests")
            for i, (reply, s, n) in enumerate(zip(replies, starts, burst_rows)):
                got = reply if isinstance(reply, Exception) else reply["LOGITS"]
                self.compare(got, s, n, f"request {i} of a burst of {len(burst_rows)}", batched=True)
            sent += len(burst_rows)
            if self.counts_after(before, sum(burst_rows)).executions - before.executions < len(burst_rows):
                return sent
        raise ExerciseError(f"after {BURST_TRIES} bursts every execution held one request: the batcher did not "
                            "batch (the server may be very busy); run the check again")
