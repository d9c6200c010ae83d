"""A real class for tests/class: three learner accounts, the shared Triton and JupyterHub, by the README's commands.

The class is made by the README's four commands for instructors ("A third command, for instructors"), read from
README.md and run as written, through sudo, from the repository root: ``sudo make setup``, ``sudo .venv/bin/lab-backends
class add-learners roster.txt``, ``sudo make class`` (in the background, until the hub answers) and, in the last test,
``sudo make class-stop``. Each gets only the test's own options after it: a unique group and a state directory of
its own (so that a machine's real class, its ``lab-class`` group and its credentials are never touched), a free hub
port and lesson 01's models (``CLASS_ARGS``, as the README says for the port). PAM: the learners' real passwords.
``make class`` byte-compiles the venv first, which learners cannot write into (without it, three learners compiled
their imports in memory: lesson 01 took 84 s instead of 53 s).
The accounts are deleted with their homes at the end, even when a test fails; whatever is still alive then is
killed by PID here.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shlex
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

from lab_backends import rest  # noqa: E402
from lab_backends.classroom.settings import PROXY_BIN  # noqa: E402
from lab_backends.server.ports import free_ports  # noqa: E402

MODELS = ("cost_model", "echo", "running_mean")  # lesson 01's two, and the sequence model (test_sandbox)
#: `make class`: its set-up and deps (nothing to do after make test's: ~2 s), the precompile (20 s of a fresh venv here,
#: 1 s after), the class (~60 s on a busy machine); 2x and more to spare.
START_DEADLINE_S = 360
README_SECTION = "### A third command, for instructors"


def readme_class_commands() -> list[str]:
    """The README's class commands, as written (its first code block under :data:`README_SECTION`, comments off)."""
    text = (ROOT / "README.md").read_text()
    assert README_SECTION in text, f"README.md has no section {README_SECTION!r}"
    block = text.split(README_SECTION, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


@dataclass
class Classroom:
    """The running class as the tests see it."""

    hub_url: str
    group: str
    learners: dict[str, str]          #: name -> password
    state_dir: Path
    proc: subprocess.Popen            #: `sudo make class`
    log: Path
    triton_http: str = ""
    stopped: bool = False
    seen: set[int] = field(default_factory=set)   #: every PID of the class seen while it ran
    #: Every command run, with its exit status (None: still running): the README's line, then the test's options.
    ran: list[tuple[str, int | None]] = field(default_factory=list)
    readme: list[str] = field(default_factory=readme_class_commands)   #: the README's four class commands

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
        """The README's ``sudo make class-stop``, once; then ``sudo make class`` must end."""
        self.remember()
        self.stopped = True
        done = run_readme(self.readme[3], f"CLASS_STOP_ARGS=--state-dir={self.state_dir}",
                          ran=self.ran, timeout=200)
        self.proc.wait(timeout=30)
        self.ran[2] = (self.ran[2][0], self.proc.returncode)
        return done


def run_readme(command: str, *options: str, ran: list[tuple[str, int | None]], cwd: Path = ROOT,
               timeout: float) -> subprocess.CompletedProcess:
    """One README command as written, with the test's ``options`` after it, in a shell from ``cwd``."""
    line = " ".join([command, *(shlex.quote(o) for o in options)])
    done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    ran.append((line, done.returncode))
    assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


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
    if shutil.which("sudo") is None:
        missing = ROOT / "test-artifacts" / "class" / "sudo-missing.txt"
        pytest.skip(missing.read_text().strip() if missing.exists() else
                    "sudo is missing: `make class-deps` installs it (tests/class run the README's `sudo make class`)")
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
    ran: list[tuple[str, int | None]] = []
    setup, add, start, _ = readme_class_commands()
    try:
        run_readme(setup, ran=ran, timeout=600)
        # The README's relative paths from a folder of the test's own: .venv is the project's, roster.txt the test's.
        (tmp / ".venv").symlink_to(ROOT / ".venv")
        run_readme(add, f"--group={group}", f"--state-dir={state}", ran=ran, cwd=tmp, timeout=120)
        for name in names:
            _lab_settings(name)
        hub_port = free_ports(1)[0]
        class_args = " ".join([f"--hub-port {hub_port} --group {group} --state-dir {state} --learner-env LAB_FAST=1",
                               *(f"--model {m}" for m in MODELS)])
        line = f"{start} {shlex.quote(f'CLASS_ARGS={class_args}')}"
        log = tmp / "class.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {line}"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    start_new_session=True)
        ran.append((line, None))
        hub_url = f"http://127.0.0.1:{hub_port}"
        deadline = time.monotonic() + START_DEADLINE_S
        while "the class runs" not in log.read_text() or not _hub_answers(hub_url):
            assert proc.poll() is None, f"`{line}` exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the class did not start in {START_DEADLINE_S} s:\n{log.read_text()}"
            time.sleep(0.5)
        room = Classroom(hub_url, group, learners, state, proc, log, ran=ran)
        http = room.settings()["triton_ports"][0]
        room.triton_http = f"127.0.0.1:{http}"
        yield room
    finally:
        if proc is not None:
            if proc.poll() is None:  # a failed test's class: stopped one layer below, by its state directory
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


def _hub_answers(url: str) -> bool:
    """The hub's API root answers 200 (it needs no login)."""
    try:
        return rest.request(f"{url}/hub/api/", timeout=2)[0] == 200
    except OSError:
        return False


def _kill_left(proc: subprocess.Popen) -> None:
    """sudo, make, the supervisor and anything of theirs still alive: killed by PID (a failed test's leftovers)."""
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
