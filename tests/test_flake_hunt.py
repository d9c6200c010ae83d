"""scripts/flake_hunt.py without a server: junit parsing, failure counting, bounded hogs, make test's flags."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import time
from pathlib import Path

import psutil

from lab_backends.classroom import sandboxed_lessons

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("flake_hunt", ROOT / "scripts" / "flake_hunt.py")
flake_hunt = importlib.util.module_from_spec(_SPEC)
sys.modules["flake_hunt"] = flake_hunt  # dataclasses look their module up by name
_SPEC.loader.exec_module(flake_hunt)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4" time="9.9">
  <testcase classname="notebooks.03b_inside_the_scheduler.ipynb" name="Cell 0" time="1.250" />
  <testcase classname="notebooks.03b_inside_the_scheduler.ipynb" name="Cell 9" time="61.002">
    <failure message="Cell execution timed out&#10;second line">Traceback ...</failure>
  </testcase>
  <testcase classname="tests.test_server.TestStart" name="test_ready[http]" time="0.5">
    <error message="failed on setup with &quot;OSError: port in use&quot;">long text</error>
  </testcase>
  <testcase classname="tests.test_server" name="test_gpu" time="0.0">
    <skipped type="pytest.skip" message="no GPU">skip</skipped>
  </testcase>
</testsuite></testsuites>
"""


def _row(round_no: int, item: str, outcome: str, message: str = "", duration: float = 1.0):
    return flake_hunt.Outcome(round_no, "notebook-cell", item, outcome, duration, 0, "t", message)


def test_parse_junit_gives_one_row_per_case(tmp_path):
    path = tmp_path / "round-1.xml"
    path.write_text(JUNIT)
    rows = flake_hunt.parse_junit(path, 1, "notebook-cell", 2, "2024-01-01T00:00:00+00:00")
    assert [(r.item, r.outcome) for r in rows] == [
        ("notebooks/03b_inside_the_scheduler.ipynb::Cell 0", "passed"),
        ("notebooks/03b_inside_the_scheduler.ipynb::Cell 9", "failed"),
        ("tests/test_server.py::TestStart::test_ready[http]", "error"),
        ("tests/test_server.py::test_gpu", "skipped"),
    ]
    assert [r.duration_s for r in rows] == [1.25, 61.002, 0.5, 0.0]
    assert rows[1].message == "Cell execution timed out"
    assert rows[2].message == 'failed on setup with "OSError: port in use"'
    assert rows[3].message == "no GPU"
    assert {(r.round, r.hog) for r in rows} == {(1, 2)}


def test_long_messages_are_cut():
    assert len(flake_hunt.first_line("x" * 1000 + "\nmore")) == flake_hunt.MESSAGE_CHARS


def test_failures_are_counted_per_item_across_rounds():
    rows = [_row(1, "a", "passed"), _row(2, "a", "failed", "boom 2"), _row(3, "a", "failed", "boom 3"),
            _row(1, "b", "error", "setup"), _row(2, "b", "passed"), _row(3, "b", "passed"),
            _row(1, "c", "passed"), _row(2, "c", "skipped"), _row(3, "c", "passed")]
    assert flake_hunt.failure_counts(rows) == [("a", 2, 3, "boom 2"), ("b", 1, 3, "setup")]
    text = flake_hunt.summary([], rows, hog=1)
    assert "| a | 2 of 3 | boom 2 |" in text and "| b | 1 of 3 | setup |" in text


def test_slowest_takes_the_max_over_rounds():
    rows = [_row(1, "a", "passed", duration=1.0), _row(2, "a", "passed", duration=5.0),
            _row(1, "b", "passed", duration=3.0)]
    assert flake_hunt.slowest(rows, 1) == [("a", 5.0)]


def test_csv_has_the_documented_columns(tmp_path):
    path = tmp_path / "flakes.csv"
    flake_hunt.write_csv([_row(1, "a", "passed")], path, append=False)
    flake_hunt.write_csv([_row(2, "a", "failed")], path, append=True)
    lines = path.read_text().splitlines()
    assert lines[0] == "round,kind,item,outcome,duration_s,hog,started_utc,message"
    assert len(lines) == 3


def test_hogs_run_inside_the_block_and_are_gone_after_it():
    with flake_hunt.cpu_hogs(1, limit_s=60) as procs:
        pid = procs[0].pid
        assert psutil.pid_exists(pid) and procs[0].poll() is None
    assert not psutil.pid_exists(pid)


def test_a_hog_stops_by_itself_after_its_limit():
    with flake_hunt.cpu_hogs(1, limit_s=0.1) as procs:  # rounded up to SIGALRM's 1 s
        deadline = time.monotonic() + 4
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs[0].poll() is not None


def test_notebook_command_uses_make_tests_nbval_flags(tmp_path):
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines()
                if line.startswith("\t") and "sandboxed_lessons" in line)
    assert shlex.split(line)[-2:] == ["-m", "lab_backends.classroom.sandboxed_lessons"]  # the stage: every lesson
    cmd = flake_hunt.notebook_command(None, tmp_path / "r.xml")
    plain = sandboxed_lessons.plain_command(["00_architecture.ipynb"])
    assert cmd[:cmd.index("notebooks")] == plain[:-1]  # the stage's own flags when it runs without a class
    assert cmd[cmd.index("notebooks") + 1:] == ["-p", "no:cacheprovider", f"--junitxml={tmp_path / 'r.xml'}"]


def test_only_picks_notebooks_by_prefix():
    picked = flake_hunt.select_notebooks(["03"])
    assert picked and all(re.match(r"notebooks/03_", p) for p in picked)
    assert flake_hunt.select_notebooks(["03b"])[0].startswith("notebooks/03b_")


def test_server_tests_use_the_server_marker(tmp_path):
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"{flake_hunt.SERVER_MARKER}: ' in pyproject
    cmd = flake_hunt.server_test_command(["batch", "stream"], tmp_path / "r.xml")
    assert cmd[cmd.index("-m", 2):cmd.index("tests") + 1] == [
        "-m", "server", *flake_hunt.SERVER_FLAGS, "-k", "batch or stream", "tests"]


def test_server_tests_are_spread_as_make_test_spreads_them():
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "-m server" in line)
    make_args = shlex.split(line.split("-m server", 1)[1])
    assert make_args[:len(flake_hunt.SERVER_FLAGS)] == flake_hunt.SERVER_FLAGS


def test_make_test_rounds_record_the_exit_status_and_wall_time(tmp_path):
    for rc, expected in ((0, "passed"), (3, "failed")):
        (tmp_path / "Makefile").write_text(f"test:\n\t@exit {rc}\n")
        info, rows = flake_hunt.run_make_test(1, 0, tmp_path)
        assert (info.returncode == 0) == (rc == 0) and [r.outcome for r in rows] == [expected]  # make says 2
        assert rows[0].kind == "make-test" and rows[0].duration_s >= 0


def test_a_hog_stops_when_its_parent_is_gone(tmp_path):
    """A hunt killed by SIGKILL cannot run its finally: its hogs must notice and stop by themselves."""
    import subprocess

    parent = (
        "import os, subprocess, sys\n"
        f"hog = subprocess.Popen({flake_hunt.hog_command(60)[:-1]!r} + [str(os.getpid())],\n"
        "                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(hog.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=30)
    pid = int(out.stdout.strip())
    def running() -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 10
    while running():
        assert time.monotonic() < deadline, "the orphaned hog kept running"
        time.sleep(0.05)
