"""The ExecuTorch build environment's stale checks (lab_backends/digits/executorch_env.py), without pip or a server.

Set-up calls :func:`executorch_env.build_digits_et` every time: a second set-up must cost a stat, so the
venv is made again only when its stamp names other pins, and the program exported again only when the
TorchScript file or the export script is newer than it. ``LAB_SKIP_EXECUTORCH`` skips both steps.
"""

from __future__ import annotations

import json
import os
import subprocess

from lab_backends.digits import executorch_env
from lab_backends.server import executorch_backend


def test_a_venv_whose_stamp_names_the_pins_is_not_made_again(tmp_path, monkeypatch) -> None:
    (tmp_path / executorch_env.STAMP).write_text(executorch_env.stamp_text())
    made = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: made.append(a))  # pip must not run
    assert executorch_env.ensure_venv(tmp_path) == tmp_path and made == []
    stamp = json.loads(executorch_env.stamp_text())
    assert stamp["executorch"] == executorch_env.EXECUTORCH_VERSION == "1.5.1"


def test_the_program_is_stale_when_missing_or_older_than_what_makes_it(tmp_path) -> None:
    program = tmp_path / "digits_et.pte"
    assert executorch_env.program_is_stale(program)
    program.write_bytes(b"x")
    newest = max(p.stat().st_mtime for p in (executorch_env.EXPORT_SCRIPT, executorch_env.ARTIFACT_DIR / "model.pt")
                 if p.exists())
    os.utime(program, (newest + 10, newest + 10))
    assert not executorch_env.program_is_stale(program)
    os.utime(program, (newest - 10, newest - 10))
    assert executorch_env.program_is_stale(program)


def test_skipping_executorch_skips_both_set_up_steps(monkeypatch) -> None:
    monkeypatch.setenv(executorch_env.SKIP_ENV, "1")
    report = executorch_env.build_digits_et()
    assert not report.exported and "skipped" in report.summary()
    assert executorch_backend.build_all() == {}
    monkeypatch.setenv(executorch_env.SKIP_ENV, "0")
    assert not executorch_env.skipped()

