"""The exercise audit: is every checker fair? (``lab-backends exercises audit``, run by ``make test``)

A checker is fair when it accepts every correct answer, refuses plausible wrong ones with a message
that names the fault, and says "not attempted" only for what the notebook hands out untouched. The
audit runs, for every registered exercise:

- the **skeleton**, read from the notebook itself (the answer cell as shipped, so the audit cannot
  drift from what a learner sees) -> must be "not attempted";
- the **reference** (``notebooks/solutions/<name>.*``) -> must pass;
- the **wrong answers** in ``tests/exercise_cases/<name>.py`` (``WRONG``, at least 3) -> each must
  be refused with a message matching its ``says`` pattern (the fault named, not any refusal);
- the **alternatives** there (``ALTERNATIVES``, at least 1: correct answers shaped unlike the
  reference) -> each must pass.

Each answer is judged on two paths: **direct** (``check(name, answer)`` called from here) and
**as-taught** (:mod:`.as_taught`: the answer put where the notebook tells the learner to put it, a C
file edited in place, and judged by the notebook's own check cell in a fresh process). An answer
whose verdict differs between the two is a shortfall: the learner would meet a checker the audit
never saw.

It prints exactly one line per exercise,
``NAME skeleton=not-attempted reference=pass wrong=K/N rejected alternative=M/N accepted; as-taught:
skeleton=... accepted``, then one indented line per shortfall, and exits non-zero when any exercise
falls short.

Why a command and not only tests: the same cases serve a maintainer who changes a checker (run it
for one exercise with ``--only``) and CI, and the line is the evidence a closing note quotes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import multiprocessing
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises import as_taught
from lab_backends.lessons.exercises.answers import (  # noqa: F401 - Wrong, SourceVariants: the cases' API
    CASES_DIR,
    MIN_ALTERNATIVES,
    MIN_WRONG,
    NOTEBOOKS_DIR,
    Answer,
    Cases,
    Judged,
    SourceVariants,
    Wrong,
    answers_of,
    judged_despite_crashes,
    load_cases,
    notebook_skeleton,
)
from lab_backends.lessons.exercises.registry import EXERCISES, Exercise, check, get, started_for


@dataclass
class Verdict:
    """What the audit found for one exercise on one path; :meth:`line` is the one line it prints."""

    name: str
    skeleton: str = "missing"
    reference: str = "missing"
    rejected: int = 0
    wrong: int = 0
    accepted: int = 0
    alternatives: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: What this path made of each answer, by label (the record ``--record`` writes).
    judged: list[Judged] = field(default_factory=list)
    #: The same answers judged on the learner's path (None when that path was not run).
    as_taught: Verdict | None = None

    @property
    def ok(self) -> bool:
        return (self.skeleton == "not-attempted" and self.reference == "pass"
                and self.wrong >= MIN_WRONG and self.rejected == self.wrong
                and self.alternatives >= MIN_ALTERNATIVES and self.accepted == self.alternatives
                and not self.problems and (self.as_taught is None or self.as_taught.ok))

    def counts(self) -> str:
        return (f"skeleton={self.skeleton} reference={self.reference} "
                f"wrong={self.rejected}/{self.wrong} rejected alternative={self.accepted}/{self.alternatives} accepted")

    def line(self) -> str:
        return f"{self.name} {self.counts()}" + (f"; as-taught: {self.as_taught.counts()}" if self.as_taught else "")


def tally(name: str, answers: list[Answer], judged: list[Judged], path: str = "") -> Verdict:
    """The verdict of one path: ``judged`` holds one entry per answer (by label), plus the missing ones."""
    verdict = Verdict(name, judged=list(judged))
    by_label = {j.label: j for j in judged}
    prefix = f"{path}: " if path else ""
    for label in ("skeleton", "reference"):
        item = by_label.get(label)
        outcome = item.outcome if item else "missing"
        setattr(verdict, label, outcome)
        if outcome != ("not-attempted" if label == "skeleton" else "pass"):
            verdict.problems.append(f"{prefix}{label}: {outcome}: {_first(item.message if item else 'not run')}")
    for answer in answers:
        item = by_label.get(answer.label, Judged(answer.label, "missing", "not run"))
        if answer.kind == "wrong":
            verdict.wrong += 1
            if item.outcome == "refused" and re.search(answer.says, item.message, re.S):
                verdict.rejected += 1
            else:
                verdict.problems.append(f"{prefix}{answer.label}: {item.outcome}, expected a refusal matching "
                                        f"/{answer.says}/: {_first(item.message)}")
        elif answer.kind == "alternative":
            verdict.alternatives += 1
            if item.outcome == "pass":
                verdict.accepted += 1
            else:
                verdict.problems.append(f"{prefix}{answer.label}: {item.outcome}: {_first(item.message)}")
    return verdict


def _directly(name: str, answer: Answer, server: Any) -> Judged:
    """``check(name, answer)`` called from here: the path every audit took before the as-taught one."""
    started = time.monotonic()
    judged = _judge_directly(name, answer, server)
    return replace(judged, seconds=round(time.monotonic() - started, 1))


def _judge_directly(name: str, answer: Answer, server: Any) -> Judged:
    try:
        result = check(name, answer.value, server, quiet=True)
    except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported with its type
        return Judged(answer.label, "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if not result.attempted:
        return Judged(answer.label, "not-attempted", result.message)
    return Judged(answer.label, "pass" if result.passed else "refused", result.message)


#: How the learner's path is run: in a fresh process by default; tests pass an in-process judge or None.
AsTaught = Callable[[str, Path, Path, Any], list[Judged]]


def _learner_path(learner_path: AsTaught, name: str, cases_dir: Path, notebooks_dir: Path, server: Any,
                  answers: list[Answer]) -> list[Judged]:
    try:
        return learner_path(name, cases_dir, notebooks_dir, server)
    except ExerciseError as exc:
        return [Judged(a.label, "error", str(exc)) for a in answers]


def audit_one(name: str, server: Any = None, cases_dir: Path = CASES_DIR, notebooks_dir: Path = NOTEBOOKS_DIR,
              learner_path: AsTaught | None = as_taught.in_fresh_process) -> Verdict:
    """Judge every answer of exercise ``name`` directly, then as taught (unless ``learner_path`` is None).

    ``server`` is handed to the checker (None: it starts its own); the as-taught process reaches it by URL.
    When the checker starts servers of its own (no models declared) and the learner's path runs in a
    fresh process, the two paths share nothing and run side by side; otherwise one after the other,
    since checkers reload models on the server they are given.
    """
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):  # the cells print the task: not the audit's business
        answers, missing, problems = answers_of(name, cases_dir, notebooks_dir)
    side_by_side = learner_path is as_taught.in_fresh_process and not get(name).models
    with concurrent.futures.ThreadPoolExecutor(1) as other:
        taught_later = (other.submit(_learner_path, learner_path, name, cases_dir, notebooks_dir, server, answers)
                        if side_by_side and learner_path is not None else None)
        direct = missing + [judged_despite_crashes(functools.partial(_directly, name, answer, server), server)
                            for answer in answers]
        if taught_later is not None:
            taught: list[Judged] | None = missing + taught_later.result()
        elif learner_path is not None:
            taught = missing + _learner_path(learner_path, name, cases_dir, notebooks_dir, server, answers)
        else:
            taught = None
    verdict = tally(name, answers, direct)
    verdict.problems += problems
    if taught is not None:
        verdict.as_taught = tally(name, answers, taught, "as-taught")
        verdict.problems += verdict.as_taught.problems
        outcome = {j.label: j.outcome for j in taught}
        verdict.problems += [f"{j.label}: direct {j.outcome}, as-taught {outcome.get(j.label, 'missing')}: the "
                             "learner's path disagrees" for j in direct if outcome.get(j.label, "missing") != j.outcome]
    verdict.seconds = time.monotonic() - started
    return verdict


def record(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """What ``exercises audit --record FILE`` writes: each exercise's verdict on each answer, both paths."""
    return [{"name": v.name, "ok": v.ok, "line": v.line(), "direct": [asdict(j) for j in v.judged],
             "as_taught": [asdict(j) for j in v.as_taught.judged] if v.as_taught else None} for v in verdicts]


def _first(message: str, width: int = 240) -> str:
    return " ".join(message.split())[:width]


@contextlib.contextmanager
def shared_servers(names: list[str]) -> Iterator[dict[bool, Any]]:
    """Two servers at most, one untraced and one traced, each with the models its exercises declare.

    Checkers that need more (their own repository, a C backend) start their own, as for a learner.
    """
    with contextlib.ExitStack() as stack:
        servers: dict[bool, Any] = {}
        for traced in (False, True):
            models = sorted({m for n in names if get(n).traced == traced for m in get(n).models})
            if models:
                servers[traced] = stack.enter_context(started_for(Exercise("audit", "", "", tuple(models),
                                                                           lambda a, s: "", traced)))
        yield servers


def _audit_group(names: list[str], done: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """``names`` in order on shared servers of their own; ``done`` hears each verdict as it is known."""
    verdicts = []
    with shared_servers(names) as servers:
        for name in names:
            ex = get(name)
            verdicts.append(audit_one(name, servers.get(ex.traced) if ex.models else None))
            if done is not None:
                done(verdicts[-1])
    return verdicts


def _emit(verdict: Verdict, emit: Callable[[str], None]) -> None:
    emit(verdict.line())
    for problem in verdict.problems:
        emit(f"  {problem}")
    taught = verdict.as_taught.judged if verdict.as_taught else []
    for path, judged in (("direct", verdict.judged), ("as-taught", taught)):
        for item in (j for j in judged if j.again):
            emit(f"  note: {item.label} ({path}) was judged again, the server crashed under it: {_first(item.again)}")


#: Seconds each exercise's audit took (both paths) with ``--jobs 3`` on this project's 2 cores (2026-12-03, after
#: notebook 09c's answers were linked with gold), used only to share the exercises fairly among the workers: a new
#: exercise counts as DEFAULT_S until measured.
TYPICAL_S = {"batch_of_eight": 112, "tune_the_batcher": 95, "queue_holds_one_batch": 93, "tf_gather_scatter": 77,
             "one_tenant_per_batch": 53, "step_and_release": 54, "longest_queue": 38, "canary_versions": 38,
             "preprocess_backend": 25, "clip_backend": 24, "framework_agreement": 21, "ensemble_with_c_preprocess": 20,
             "metrics_window": 15, "interleaved_sequences": 3, "request_path": 3, "kserve_json_body": 2,
             "executorch_binding": 160, "paged_kv_blocks": 46}
DEFAULT_S = 30.0


def balanced(names: list[str], jobs: int) -> list[list[str]]:
    """``names`` in ``jobs`` groups of about equal time: the longest first, each to the least loaded group."""
    groups: list[list[str]] = [[] for _ in range(min(jobs, len(names)))]
    load = [0.0] * len(groups)
    for name in sorted(names, key=lambda n: (-TYPICAL_S.get(n, DEFAULT_S), n)):
        least = load.index(min(load))
        groups[least].append(name)
        load[least] += TYPICAL_S.get(name, DEFAULT_S)
    return [g for g in groups if g]


def audit(names: list[str] | None = None, emit: Callable[[str], None] = print, jobs: int = 1) -> list[Verdict]:
    """Audit ``names`` (every registered exercise by default); print one line each, in name order.

    ``jobs`` > 1 splits the exercises among that many worker processes (spawned: no gRPC state is
    forked), each with its own servers on free ports; their lines are printed when all are done, in
    the same order as a single run's. Most checkers wait on servers starting and loading, which is
    why three workers on two cores finish sooner; :func:`balanced` shares the work out.
    """
    names = names or sorted(EXERCISES)
    if jobs <= 1 or len(names) <= 1:
        return _audit_group(names, lambda verdict: _emit(verdict, emit))
    groups = balanced(names, jobs)
    with concurrent.futures.ProcessPoolExecutor(len(groups), mp_context=multiprocessing.get_context("spawn")) as pool:
        done = [v for part in pool.map(_audit_group, groups) for v in part]
    verdicts = sorted(done, key=lambda v: names.index(v.name))
    for verdict in verdicts:
        _emit(verdict, emit)
    return verdicts
