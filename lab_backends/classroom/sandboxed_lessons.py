"""Every lesson run to its end by learners of a class, each in a sandbox made as the spawner makes one
(``make test``'s notebook stage, as root): ``python -m lab_backends.classroom.sandboxed_lessons``.

Why: a lesson that works for the instructor can fail for a learner. A learner's kernel runs as their
own account, with their copy of the course in ``~/notebooks``, the project's ``build/`` readable
but not writable, their own ``/dev/shm``, no network but their own loopback, ``umask 077``, and the
class's memory, process and CPU limits (issue 38). Lessons 09 and 09b once wrote into ``build/``
and would have failed for every learner. So the notebook stage itself runs that way, not beside it:
the lessons are shared among :data:`LEARNERS` temporary accounts, which run them at once, each one
lesson after another in one sandbox (nbval, the same flags as the stage had, ``LAB_FORCE_REMEASURE``
as before), like three learners working beside each other. The accounts, their homes, groups,
namespaces and processes are removed after, also when a lesson fails. What nbval executed is copied
back to ``build/executed/`` for the book (``book/capture.py``).

Without root (or without cgroup v1, ``ip``, ``socat``) there is no class to make: the stage then runs
the lessons as before, beside the tests (:func:`plain_command`), and says so.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.classroom.network import LearnerNetwork, close_network, namespace_name, open_network
from lab_backends.classroom.roster import Learner, add_learners, kill_processes_of, remove_learners
from lab_backends.classroom.spawner import KERNEL_STARTUP, copy_course, namespace_command
from lab_backends.paths import NOTEBOOK_DIR, PROJECT_ROOT, executed_dir

LEARNERS = 3
#: nbval as make test runs it, less the workers (each learner runs one lesson at a time).
NBVAL_FLAGS = ["--nbval-lax", f"--nbval-sanitize-with={PROJECT_ROOT / 'tests' / 'nbval_sanitize.cfg'}",
               "--nbval-cell-timeout=120"]
#: Seconds each lesson's cells took beside a one-core hog (bench/flakes.csv, 2026-12-03): the shares are
#: balanced with them. A lesson not listed counts as :data:`UNKNOWN_S`.
LESSON_S = {"00": 18, "01": 12, "02": 19, "03": 175, "03b": 105, "04": 19, "05": 67, "06": 30, "07": 35,
            "08": 15, "08b": 27, "08c": 33, "09": 35, "09b": 47, "09c": 66, "09d": 25, "10": 51, "11": 22}
UNKNOWN_S = 30


@dataclass
class Sandbox:
    """One temporary learner: the account, its lessons, and what was made for it (removed by :func:`close`)."""

    name: str
    lessons: list[str]
    groups: list[Path] | None = None
    network: LearnerNetwork | None = None
    process: subprocess.Popen | None = None
    log: Path | None = None


def shares(lessons: list[str], n: int = LEARNERS) -> list[list[str]]:
    """``lessons`` (file names) in ``n`` shares of about equal time: the longest first, each to the lightest share."""
    weight = {name: LESSON_S.get(name.split("_", 1)[0], UNKNOWN_S) for name in lessons}
    out: list[list[str]] = [[] for _ in range(n)]
    for name in sorted(lessons, key=lambda x: -weight[x]):
        min(out, key=lambda share: sum(weight[x] for x in share)).append(name)
    return [sorted(share) for share in out if share]


#: The stage without a class: nbval on three workers, one notebook each (scripts/flake_hunt.py runs the same).
PLAIN_FLAGS = ["-n", str(LEARNERS), "--dist", "loadfile", *NBVAL_FLAGS]


def plain_command(lessons: list[str]) -> list[str]:
    """The stage without a class: the lessons beside the tests, as nbval runs them with :data:`PLAIN_FLAGS`."""
    return [sys.executable, "-m", "pytest", *PLAIN_FLAGS, *(str(NOTEBOOK_DIR / name) for name in lessons)]


def sandbox_possible() -> str:
    """Empty when a class sandbox can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "nsenter", "socat", "unshare", "setpriv", "useradd") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} missing"
    try:
        cgroups.own_group("memory")
    except cgroups.LimitsError as exc:
        return str(exc)
    return ""


def learner_command(home: Path, lessons: list[str]) -> list[str]:
    """What the learner runs in their sandbox: nbval on their copy of ``lessons``, with a learner's environment."""
    lab = home / ".lab-backends"
    env = {"HOME": str(home), "USER": home.name, "LOGNAME": home.name, "LAB_RUNS_DIR": str(lab / "runs"),
           "LAB_SCRATCH_DIR": str(lab / "build"), "LAB_BOOK_EXECUTED": str(home / "executed"),
           "PYTHONSTARTUP": str(KERNEL_STARTUP), "LAB_FORCE_REMEASURE": "1"}
    return ["env", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", 'cd "$HOME/notebooks" && exec "$@"', "sh",
            sys.executable, "-m", "pytest", "--rootdir=.", "-p", "no:cacheprovider", "-ra", "--timeout=600",
            *NBVAL_FLAGS, *lessons]


def start(sandbox: Sandbox, limits: LearnerLimits, logs: Path) -> None:
    """The learner's course copy (with the stage's nbval hooks), limits and network; then their nbval run."""
    entry = pwd.getpwnam(sandbox.name)
    home = Path(entry.pw_dir)
    copy_course(NOTEBOOK_DIR, home, sandbox.name)
    hooks = home / "notebooks" / "conftest.py"  # not part of the course (copy_course leaves it out): the stage's
    shutil.copy(NOTEBOOK_DIR / "conftest.py", hooks)
    os.chown(hooks, entry.pw_uid, entry.pw_gid)
    sandbox.groups = cgroups.create(sandbox.name, limits)
    sandbox.network = open_network(sandbox.name, inward=[], outward=[])
    sandbox.log = logs / f"{sandbox.name}.log"
    with open(sandbox.log, "w") as log:
        sandbox.process = subprocess.Popen(
            [*cgroups.join_command(sandbox.groups), *sandbox.network.enter(),
             *namespace_command(sandbox.name, learner_command(home, sandbox.lessons))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(home))


def collect_executed(sandbox: Sandbox) -> list[str]:
    """What nbval executed for the learner, copied to the book's folder; the lessons without a copy *owned by the
    learner* (the evidence that their kernel, not root's, ran them), which fail the stage."""
    entry = pwd.getpwnam(sandbox.name)
    missing = []
    for lesson in sandbox.lessons:
        executed = Path(entry.pw_dir) / "executed" / lesson
        if not executed.is_file() or executed.stat().st_uid != entry.pw_uid:
            missing.append(lesson)
            continue
        executed_dir().mkdir(parents=True, exist_ok=True)
        shutil.copyfile(executed, executed_dir() / lesson)  # root's, 0644: not the learner's 0600
        os.chmod(executed_dir() / lesson, 0o644)
    return missing


def close(sandbox: Sandbox) -> None:
    """Its processes (by PID), network namespace and groups removed; idempotent."""
    if sandbox.process is not None and sandbox.process.poll() is None:
        sandbox.process.kill()
        sandbox.process.wait(timeout=30)
    try:
        kill_processes_of(pwd.getpwnam(sandbox.name).pw_uid)
    except KeyError:
        pass
    close_network(sandbox.network or LearnerNetwork(namespace_name(sandbox.name)))
    cgroups.remove(sandbox.name)


def say(line: str) -> None:
    print(line, flush=True)


def run(lessons: list[str], limits: LearnerLimits = LearnerLimits()) -> int:
    """Run ``lessons`` as :data:`LEARNERS` sandboxed learners; nbval's worst exit status."""
    tag = secrets.token_hex(3)
    group = f"lab-nb-{tag}"
    sandboxes = [Sandbox(f"labnb{tag}{i}", share) for i, share in enumerate(shares(lessons))]
    logs = PROJECT_ROOT / "test-artifacts" / "sandboxed-lessons"  # each learner's nbval output, kept for CI
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        add_learners([Learner(s.name, secrets.token_urlsafe(16)) for s in sandboxes], group, say=say)
        for sandbox in sandboxes:
            start(sandbox, limits, logs)
            say(f"{sandbox.name} runs {', '.join(sandbox.lessons)} in a sandbox ({limits.describe()})")
        codes = [s.process.wait() for s in sandboxes if s.process is not None]
        unproven = []
        for sandbox in sandboxes:
            say(f"--- {sandbox.name}: {', '.join(sandbox.lessons)} (exit {sandbox.process.returncode}) ---")
            say(sandbox.log.read_text(errors="replace").rstrip())
            unproven += collect_executed(sandbox)
        say(f"{len(lessons)} lessons run by {len(sandboxes)} sandboxed learners in {time.monotonic() - started:.0f} s")
        if unproven:
            say(f"error: no executed copy written by its learner for {', '.join(unproven)}")
        return max([*codes, 1 if unproven else 0])
    finally:
        for sandbox in sandboxes:
            close(sandbox)
        remove_learners([s.name for s in sandboxes], group, say=say)
        subprocess.run(["groupdel", group], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    lessons = argv if argv else sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    # A stopped stage (CI's timeout, `kill`) still removes its accounts: SIGTERM unwinds through run()'s finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why_not = sandbox_possible()
    if why_not:
        print(f"lessons run beside the tests, not as sandboxed learners ({why_not}: a class needs root)", flush=True)
        return subprocess.call(plain_command(lessons), env={**os.environ, "LAB_FORCE_REMEASURE": "1"})
    return run(lessons)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
