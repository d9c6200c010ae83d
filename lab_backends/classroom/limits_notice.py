"""In a class learner's kernel: one line in the notebook when the class's limits stopped something.

A learner who hits a limit (``cgroups.py``) would otherwise see only the kernel's words: a fork
refused with ``BlockingIOError: [Errno 11] Resource temporarily unavailable``, or JupyterLab's
"the kernel appears to have died" after the memory cgroup's OOM killer stopped it, and nothing
that says a class limit did it, which limit, or what to do. So every learner kernel runs
:func:`install` before its first cell (the spawner sets ``PYTHONSTARTUP`` to ``kernel_startup.py``;
IPython runs that file in every kernel it starts, ``InteractiveShellApp.exec_PYTHONSTARTUP``):

* after each cell, one line when the learner's ``pids.events`` count of refused forks and threads
  grew since the kernel last said so (a fork bomb the cell started as a process of its own, say);
  an error raised by such a refusal in the kernel itself prints that line instead of a traceback
  (``notebook.explain``);
* the first cell a kernel runs after the memory group's ``oom_kill`` count grew prints one line
  first: a process of the learner's (often their previous kernel) was stopped by the memory limit;
  so does the end of a cell during which it grew, and an error raised after it grew (a call to the
  learner's embedded Triton, when that was the process stopped) prints the error's first line and
  that one. What was last reported is kept in ``~/.lab-backends/limits-seen.json``, per group (the
  group is made anew with each start of the learner's server, and its counters with it).

A kernel that holds a gRPC client (every lesson's) stopped answering when it forked at the task limit
itself (seen here: gRPC's threads logged ``thd.cc pthread_create failed`` with growing pauses; why the
kernel then hangs was not traced), so the notice also says how to get out (restart the kernel, or
stop and start the server).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab_backends import notebook
from lab_backends.classroom.cgroups import GIB, LimitsError, counter, own_group

SEEN = Path.home() / ".lab-backends" / "limits-seen.json"


def _group(controller: str) -> Path | None:
    try:
        return own_group(controller)
    except (LimitsError, OSError):
        return None


class Notices:
    """The counters this kernel last reported, and the explanations."""

    def __init__(self) -> None:
        self.pids = _group("pids")
        self.memory = _group("memory")
        self.refused_seen = self._refused()

    def _refused(self) -> int:
        return counter(self.pids / "pids.events", "max") if self.pids else 0

    def tasks_refused(self) -> str | None:
        """One line when the learner's task limit refused forks or threads since this kernel last said so."""
        refused = self._refused()
        if refused <= self.refused_seen:
            return None
        new, self.refused_seen = refused - self.refused_seen, refused
        limit = (self.pids / "pids.max").read_text().strip()
        return (f"the class's limit of {limit} processes and threads per learner refused {new} new one(s). Stop what "
                "you started (your embedded servers' .stop(), kernels and terminals you do not need). If this kernel "
                "stops answering, restart it; if nothing starts any more, File > Hub Control Panel > Stop My Server, "
                "then start it again.")

    def tasks(self, value: BaseException) -> str | None:
        """An error raised after the task limit refused a fork or a thread: its name, and why."""
        line = self.tasks_refused()
        return f"{type(value).__name__}: {line}" if line else None

    def memory_error(self, value: BaseException) -> str | None:
        """An error raised after the memory limit stopped a process (the learner's embedded Triton, say)."""
        line = self.memory_kills()
        if not line:
            return None
        first = (str(value).splitlines() or [""])[0][:200]
        return f"{type(value).__name__}: {first}\n{line}"

    def memory_kills(self) -> str | None:
        """One line when the memory group's OOM kills grew since the last one reported (and record them)."""
        if self.memory is None:
            return None
        kills = counter(self.memory / "memory.oom_control", "oom_kill")
        if kills == 0:
            return None  # the common case, after every cell: no file to read
        key = f"{self.memory}@{self.memory.stat().st_ino}"
        try:
            seen = json.loads(SEEN.read_text())
        except (OSError, ValueError):
            seen = {}
        if kills <= seen.get(key, 0):
            return None
        SEEN.parent.mkdir(parents=True, exist_ok=True)
        SEEN.write_text(json.dumps({key: kills}))
        limit = int((self.memory / "memory.limit_in_bytes").read_text()) / GIB
        return (f"the class's memory limit ({limit:g} GiB per learner, for all your processes together) stopped a "
                f"process of yours ({kills} so far): when a kernel 'appears to have died', that was it. Use smaller "
                "arrays, or stop your embedded servers and other kernels you do not need, and run the cells again.")

    def after_cell(self) -> list[str]:
        """What a cell's limits stopped (a process it started, too): the lines not said yet."""
        return [line for line in (self.tasks_refused(), self.memory_kills()) if line]


def _say(lines: list[str | None]) -> None:
    for line in lines:
        if line:
            print(line, file=sys.stderr)


def install() -> bool:
    """Register the notices in this IPython kernel and say what stopped its predecessor, if a limit did.

    Called from the kernel's first ``pre_run_cell`` (``kernel_startup.py``), so the first-cell notice
    is said now. False outside IPython or outside a learner's limits.
    """
    shell = notebook.ipython_shell()
    notices = Notices()
    if shell is None or (notices.pids is None and notices.memory is None):
        return False
    notebook.explain(notices.tasks)
    notebook.explain(notices.memory_error)
    shell.events.register("post_run_cell", lambda *_: _say(notices.after_cell()))
    _say([notices.memory_kills()])  # the previous kernel's death, if the memory limit was its cause
    return True
