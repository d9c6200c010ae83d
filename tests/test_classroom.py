"""The class's pure parts: roster lines (one error each, with the fix), the restricted APIs of a class
server, the hub config (names the shared Triton, never a key), the namespace command line, and (as root) that
a learner's namespace reaps its orphans."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lab_backends import learner
from lab_backends.classroom import roster, settings, spawner
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.errors import LabBackendsError
from lab_backends.server import admin


def test_a_roster_gives_names_and_passwords() -> None:
    learners = roster.parse_roster("# class A\nada\nbob  s3cret-pass  # given\n\n")
    assert [lr.name for lr in learners] == ["ada", "bob"] and learners[1].password == "s3cret-pass"
    assert len(learners[0].password) >= 12  # generated


@pytest.mark.parametrize("text, says", [
    ("Ada\n", "not a Unix user name"),
    ("ada\nada\n", "listed twice (first on line 1)"),
    ("ada short\n", "shorter than 8"),
    ("ada a b\n", "'name' or 'name password'"),
    ("# nobody\n", "names no learner"),
])
def test_each_bad_roster_line_is_one_error_with_the_fix(text: str, says: str) -> None:
    with pytest.raises(roster.RosterError) as caught:
        roster.parse_roster(text, "r.txt")
    assert says in str(caught.value)


def test_a_class_server_keeps_model_control_behind_the_key() -> None:
    assert admin.restricted_list(",".join(admin.CLASS_RESTRICTED)) == admin.CLASS_RESTRICTED
    with pytest.raises(LabBackendsError, match="must keep model-repository"):
        admin.restricted_list("trace,logging")
    with pytest.raises(LabBackendsError, match="unknown API"):
        admin.restricted_list("model-repository,everything")


def test_the_hub_config_points_at_triton_and_carries_no_key() -> None:
    s = settings.ClassSettings(8000, 8081, 8082, (9000, 9001, 9002), dummy_password="")
    text = settings.hub_config(s)
    assert "'TRITON_URL': 'http://127.0.0.1:9000'" in text and "'TRITON_GRPC_URL': '127.0.0.1:9001'" in text
    assert "admin" not in text.lower() and "c.JupyterHub.ip = '127.0.0.1'" in text
    assert "allowed_groups = {'lab-class'}" in text
    assert settings.ClassSettings.from_json(s.to_json()) == s


def test_the_hub_config_gives_each_learner_a_sandbox_with_the_class_limits() -> None:
    limits = LearnerLimits(memory_bytes=3 << 30, tasks=512, cpu_shares=256)
    s = settings.ClassSettings(8000, 8081, 8082, (9000, 9001, 9002), limits=limits)
    text = settings.hub_config(s)
    assert "c.NamespaceSpawner.outward_ports = [8081, 9000, 9001, 9002]" in text  # the hub's API and the door's
    assert f"c.NamespaceSpawner.learner_memory = {3 << 30}" in text and "learner_tasks = 512" in text
    assert "learner_cpu_shares = 256" in text
    assert settings.ClassSettings.from_json(s.to_json()).limits == limits


def test_a_learners_sequence_ids_are_their_own_on_a_shared_server() -> None:
    """Two learners who both pick ID 7 send different correlation IDs; outside a class nothing changes."""
    ada = {learner.LEARNER_VAR: "ada", learner.TOKEN_VAR: "t"}
    mine, theirs = learner.sequence_id(7, ada, uid=1001), learner.sequence_id(7, ada, uid=1002)
    assert mine != theirs and mine % learner.SEQUENCE_SPAN == 7 and mine // learner.SEQUENCE_SPAN == 1001
    assert learner.sequence_id(7, {}) == 7 and learner.sequence_id(0, ada, uid=1001) == 0  # 0: no sequence
    assert learner.sequence_id("s-7", ada, uid=1001) == "ada:s-7" == learner.sequence_id("ada:s-7", ada)  # named
    assert learner.sequence_id("s-7", {}) == "s-7"  # outside a class, strings pass as they are
    with pytest.raises(ValueError, match="between 1 and 4294967295"):
        learner.sequence_id(learner.SEQUENCE_SPAN, ada, uid=1001)


def test_the_learner_runs_in_a_new_pid_namespace_as_themselves() -> None:
    cmd = spawner.namespace_command("root", ["jupyterhub-singleuser"])
    assert cmd[:4] == ["unshare", "--pid", "--fork", "--mount-proc"]
    assert "--reuid=root" in cmd and "--no-new-privs" in cmd and cmd[-1] == "jupyterhub-singleuser"
    assert cmd[-3:-1] == [str(settings.DUMB_INIT), "--"], "the namespace's PID 1 must be dumb-init"


#: Run inside a namespace: orphan a ``sleep`` (its shell exits at once), then report what became of it.
#: A zombie must stay one for 5 s to count: under dumb-init it is one only until PID 1 gets SIGCHLD.
_ORPHAN = """
import subprocess, time, psutil
pid = int(subprocess.run(['sh', '-c', 'sleep 0.2 >/dev/null & echo $!'], capture_output=True, text=True).stdout)
def state():
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return 'reaped'
deadline = time.monotonic() + 30
while state() not in ('reaped', psutil.STATUS_ZOMBIE) and time.monotonic() < deadline:
    time.sleep(0.05)
settle = time.monotonic() + 5
while state() == psutil.STATUS_ZOMBIE and time.monotonic() < settle:
    time.sleep(0.05)
print(state())
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or not settings.DUMB_INIT.exists(),
                    reason="needs root, unshare and the class extra's dumb-init (make test has all three)")
def test_orphans_in_a_learner_namespace_are_reaped() -> None:
    """A learner's namespace reaps orphans (a watchdog whose kernel died, say); without dumb-init it does not."""
    cmd = spawner.namespace_command("root", [sys.executable, "-c", _ORPHAN])
    i = cmd.index(str(settings.DUMB_INIT))
    runs = {"dumb-init": cmd, "control, no init": cmd[:i] + cmd[i + 2:]}
    seen = {name: subprocess.run(c, capture_output=True, text=True, timeout=90).stdout.strip()
            for name, c in runs.items()}
    assert seen["dumb-init"] == "reaped", f"an orphan in a learner's namespace was left as {seen['dumb-init']!r}"
    assert seen["control, no init"] == psutil.STATUS_ZOMBIE, f"control failed: {seen}"


#: Run inside a namespace: what /dev/shm holds, then a region of its own left behind.
_SHM_PROBE = """
import os, sys
print(sorted(os.listdir('/dev/shm')))
open('/dev/shm/' + sys.argv[1], 'w').write('inside')
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or not settings.DUMB_INIT.exists(),
                    reason="needs root, unshare and the class extra's dumb-init (make test has all three)")
def test_a_learner_namespace_has_a_dev_shm_of_its_own() -> None:
    """A region on the machine's /dev/shm is not seen inside; one made inside never reaches the machine's."""
    outside, inside = f"lab-probe-host-{os.getpid()}", f"lab-probe-learner-{os.getpid()}"
    host = Path("/dev/shm") / outside
    host.write_text("host")
    try:
        cmd = spawner.namespace_command("root", [sys.executable, "-c", _SHM_PROBE, inside])
        seen = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        assert seen.returncode == 0, seen.stderr
        assert outside not in seen.stdout and "[" in seen.stdout, seen.stdout
        assert not (Path("/dev/shm") / inside).exists(), "the learner's region reached the machine's /dev/shm"
        control = subprocess.run([sys.executable, "-c", _SHM_PROBE, inside], capture_output=True, text=True)
        assert outside in control.stdout, "control: the probe does not see the machine's /dev/shm outside"
    finally:
        host.unlink(missing_ok=True)
        (Path("/dev/shm") / inside).unlink(missing_ok=True)
