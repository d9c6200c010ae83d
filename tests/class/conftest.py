"""A real class for tests/class: three learner accounts, the shared Triton and JupyterHub, by the real commands.

The accounts (``lab-backends class add-learners``) get a unique prefix and their own Unix group,
and are deleted with their homes at the end, even when a test fails. The class is
``lab-backends class start`` as ``make class`` runs it (PAM: the learners' real passwords), with the
two models lesson 01 needs; ``lab-backends class stop`` stops it (the last test checks that it left
nothing), and whatever is still alive then is killed by PID here.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
sys.path.insert(0, str(ROOT / "tests"))  # the browser helpers: tests/browser/test_lab_in_browser.py

from browser.test_lab_in_browser import CHROMIUM, LAB_SETTINGS, _skip_without_chromium  # noqa: E402

from lab_backends.classroom.settings import PROXY_BIN  # noqa: E402
from lab_backends.server.ports import free_ports  # noqa: E402

MODELS = ("cost_model", "echo", "running_mean")  # lesson 01's two, and the sequence model (test_sandbox)
START_DEADLINE_S = 240


@dataclass
class Classroom:
    """The running class as the tests see it."""

    hub_url: str
    group: str
    learners: dict[str, str]          #: name -> password
    state_dir: Path
    proc: subprocess.Popen            #: `lab-backends class start`
    log: Path
    triton_http: str = ""
    stopped: bool = False
    seen: set[int] = field(default_factory=set)   #: every PID of the class seen while it ran

    @property
    def key(self) -> str:
        return (self.state_dir / "admin-key").read_text().strip()

    def settings(self) -> dict:
        return json.loads((self.state_dir / "settings.json").read_text())

    def remember(self) -> None:
        try:
            self.seen.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def stop(self) -> subprocess.CompletedProcess:
        """``lab-backends class stop``, once."""
        self.remember()
        self.stopped = True
        done = subprocess.run([str(BIN / "lab-backends"), "class", "stop", "--state-dir", str(self.state_dir)],
                              capture_output=True, text=True, timeout=200)
        self.proc.wait(timeout=30)
        return done


#: The import graphs of a learner's JupyterLab, its kernel and lesson 01's first cell.
LEARNER_IMPORTS = ("import jupyterhub.singleuser, jupyter_server.serverapp, jupyterlab.labapp, ipykernel.kernelapp, "
                   "ipykernel.ipkernel, matplotlib.pyplot, matplotlib_inline.backend_inline, pandas, "
                   "lab_backends.lessons.exercises, lab_backends.lessons.protocol_reading, "
                   "lab_backends.client.latency, lab_backends.server.triton_server")


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("tests/class create Unix accounts and spawn learners as themselves: run as root (CI does)")
    if not PROXY_BIN.exists():
        pytest.skip(f"configurable-http-proxy is missing at {PROXY_BIN}: `make class-deps` installs it (npm)")
    if not (BIN / "jupyterhub").exists():
        pytest.skip("jupyterhub is not installed: `pip install -e '.[class]'` (make test does)")
    if shutil.which("socat") is None:
        missing = ROOT / "test-artifacts" / "class" / "socat-missing.txt"
        pytest.skip(missing.read_text().strip() if missing.exists() else
                    "socat is missing: `make class-deps` installs it (each learner's network namespace needs it)")
    _skip_without_chromium()
    assert CHROMIUM.exists()


def _lab_settings(name: str) -> None:
    """The browser tests' JupyterLab settings (every cell rendered, no autosave) in the learner's home."""
    entry = pwd.getpwnam(name)
    base = Path(entry.pw_dir) / ".jupyter" / "lab" / "user-settings"
    for plugin, values in LAB_SETTINGS.items():
        path = base / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    for path in [Path(entry.pw_dir) / ".jupyter", *(Path(entry.pw_dir) / ".jupyter").rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _cleanup_accounts(roster: Path, group: str, names: list[str]) -> None:
    subprocess.run([str(BIN / "lab-backends"), "class", "remove-learners", str(roster), "--group", group],
                   capture_output=True, timeout=120)
    for name in names:  # whatever the command could not remove (it refuses accounts outside the group)
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)
    subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture(scope="module")
def classroom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Classroom]:
    _skip_unless_possible()
    tmp = tmp_path_factory.mktemp("class")
    prefix = "lbt" + secrets.token_hex(3)
    group, names = f"{prefix}g", [f"{prefix}{c}" for c in "abc"]
    learners = {name: secrets.token_urlsafe(12) for name in names}
    roster = tmp / "roster.txt"
    roster.write_text("".join(f"{n} {p}\n" for n, p in learners.items()))
    state = tmp / "state"
    proc = log = None
    try:
        add = subprocess.run([str(BIN / "lab-backends"), "class", "add-learners", str(roster), "--group", group,
                              "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
        assert add.returncode == 0, f"add-learners failed: {add.stderr}"
        for name in names:
            _lab_settings(name)
        # What a learner's server and lesson 01 import, imported once as root first, so that Python caches their
        # bytecode: make test installs with pip --no-compile and learners cannot write into the venv (without
        # this, three learners compiled it all in memory: lesson 01 took 84 s instead of 53 s). `make class`
        # compiles the whole venv instead (Makefile).
        warm = subprocess.run([str(BIN / "python"), "-c", LEARNER_IMPORTS], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert warm.returncode == 0, warm.stderr
        hub_port = free_ports(1)[0]
        log = tmp / "class.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(BIN / "lab-backends"), "class", "start", "--group", group, "--state-dir", str(state),
                 "--hub-port", str(hub_port), "--learner-env", "LAB_FAST=1",
                 *[a for m in MODELS for a in ("--model", m)]],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while "the class runs" not in log.read_text():
            assert proc.poll() is None, f"class start exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the class did not start in {START_DEADLINE_S} s:\n{log.read_text()}"
            time.sleep(0.5)
        room = Classroom(f"http://127.0.0.1:{hub_port}", group, learners, state, proc, log)
        http = room.settings()["triton_ports"][0]
        room.triton_http = f"127.0.0.1:{http}"
        yield room
    finally:
        if proc is not None:
            if proc.poll() is None:
                subprocess.run([str(BIN / "lab-backends"), "class", "stop", "--state-dir", str(state)],
                               capture_output=True, timeout=200)
            _kill_left(proc)
            artifacts = ROOT / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            shutil.copy(log, artifacts / "class-start.log")
            for name in ("hub.log", "triton.log"):
                if (state / name).exists():
                    shutil.copy(state / name, artifacts / f"class-{name}")
        _cleanup_accounts(roster, group, names)


def _kill_left(proc: subprocess.Popen) -> None:
    """The supervisor and anything of its session still alive: killed by PID (a failed test's leftovers)."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    if proc.poll() is None:
        proc.wait(timeout=10)
