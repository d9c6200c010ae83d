"""make test's notebook stage: every lesson run by sandboxed learners of a class, or, without root, beside the tests.

The sandboxed run itself is the stage (``make test`` runs it as root on every CI run: 283 cells as three
learners, 243 s); these tests pin what it is made of and force the path it takes without root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from lab_backends.classroom import sandboxed_lessons
from lab_backends.paths import NOTEBOOK_DIR, PROJECT_ROOT, lesson_notebooks


def test_every_lesson_goes_to_exactly_one_learner_and_the_shares_weigh_about_the_same() -> None:
    lessons = [p.name for p in lesson_notebooks()]
    shares = sandboxed_lessons.shares(lessons)
    assert len(shares) == sandboxed_lessons.LEARNERS
    assert sorted(name for share in shares for name in share) == sorted(lessons)
    weigh = [sum(sandboxed_lessons.LESSON_S.get(n.split("_", 1)[0], sandboxed_lessons.UNKNOWN_S) for n in share)
             for share in shares]
    assert max(weigh) <= 1.1 * min(weigh), weigh
    assert all(name.split("_", 1)[0] in sandboxed_lessons.LESSON_S for name in lessons)  # a new lesson: time it
    assert sandboxed_lessons.shares(["99_new.ipynb"]) == [["99_new.ipynb"]]  # unknown: UNKNOWN_S, still run


def test_a_learner_runs_their_own_copy_with_a_learners_environment(tmp_path) -> None:
    home = tmp_path / "labnb0"
    command = sandboxed_lessons.learner_command(home, ["01_rest_and_grpc.ipynb"])
    env = dict(arg.split("=", 1) for arg in command[1:command.index("sh")])
    assert env["HOME"] == str(home) and env["USER"] == "labnb0" and env["LAB_FORCE_REMEASURE"] == "1"
    for key in ("LAB_RUNS_DIR", "LAB_SCRATCH_DIR", "LAB_BOOK_EXECUTED"):
        assert env[key].startswith(str(home)), key  # nothing under the project's build/, which is not theirs
    assert 'cd "$HOME/notebooks"' in command[command.index("sh") + 2]
    assert command[-1] == "01_rest_and_grpc.ipynb" and "--rootdir=." in command
    assert set(sandboxed_lessons.NBVAL_FLAGS) <= set(command)


def test_without_root_the_stage_runs_the_lessons_beside_the_tests_and_says_so(monkeypatch, capsys) -> None:
    """Forced: the path a machine without root takes (CI is root, so it never takes it there)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # main's SIGTERM hook stays out of this worker
    assert sandboxed_lessons.sandbox_possible() == "not root"
    ran = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: ran.append((cmd, env)) or 0)
    assert sandboxed_lessons.main(["01_rest_and_grpc.ipynb"]) == 0
    assert "not as sandboxed learners (not root" in capsys.readouterr().out
    [(command, env)] = ran
    assert command == [sys.executable, "-m", "pytest", *sandboxed_lessons.PLAIN_FLAGS,
                       str(NOTEBOOK_DIR / "01_rest_and_grpc.ipynb")]
    assert env["LAB_FORCE_REMEASURE"] == "1"
    assert f"--nbval-sanitize-with={PROJECT_ROOT / 'tests' / 'nbval_sanitize.cfg'}" in command
