"""Run one piece of work on a worker thread and stop *waiting* for it at a deadline.

Why: a widget's button callback that waits on a stuck load leaves its panel on "running..." for
good, with no message. A thread cannot be killed, so the honest thing is to stop waiting, say so,
and hear from the work when (if) it ends: :class:`DeadlineRun` does exactly that, nothing more.
``concurrent.futures`` (``result(timeout)`` plus ``add_done_callback``) could carry the same
work, but the ordering is the point here: under one lock, either the work ended before the caller
gave up, or the caller's "gave up" message comes first and ``late_end`` follows it exactly once.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class DeadlineRun(Generic[T]):
    """``work()`` on a worker thread, so that the caller can stop waiting for it; ``lock`` orders the reports."""

    def __init__(self, work: Callable[[], T], lock: threading.Lock,
                 late_end: Callable[["DeadlineRun[T]"], None]) -> None:
        self.result: T | None = None
        self.exc: BaseException | None = None
        self.done = self.abandoned = False
        self.lock, self.late_end = lock, late_end
        self.thread = threading.Thread(target=self._work, args=(work,), name="lab-panel-load", daemon=True)

    def _work(self, work: Callable[[], T]) -> None:
        try:
            self.result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which shows it
            self.exc = exc
        finally:
            with self.lock:
                self.done = True
                if self.abandoned:
                    self.late_end(self)

    def wait(self, seconds: float, abandon: Callable[[], None]) -> bool:
        """Start, wait up to ``seconds``; False (after ``abandon()``, before any late report) if still running."""
        self.thread.start()
        self.thread.join(seconds)
        with self.lock:
            if not self.done:
                self.abandoned = True
                abandon()
            return self.done
