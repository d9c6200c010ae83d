"""lab_backends.server.processes on real processes (no Triton): groups, children, zombies, shm names.

The process groups here are small shell families started in their own session, like ``tritonserver``
and its stubs; shared-memory names are looked for in a temporary folder standing in for /dev/shm, so
nothing here touches the regions of a server that may run beside these tests.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lab_backends.server import processes
from lab_backends.waiting import poll

REGION = processes.SHM_PREFIX + "test_processes"


@pytest.fixture
def family():
    """A session leader (bash) with two children, like a server with two stubs; killed afterwards."""
    leader = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    poll(lambda: _names(processes.children(leader.pid)), lambda names: names == ["sleep", "sleep"], 10)
    yield leader
    processes.kill_group(leader.pid, signal.SIGKILL)
    leader.wait()


@pytest.fixture
def shm_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(processes, "SHM_DIR", tmp_path)
    return tmp_path


def _names(pids: list[int]) -> list[str]:
    """Names of these processes (a child forked by bash is named bash until it has exec'd)."""
    try:
        return [psutil.Process(p).name() for p in pids]
    except psutil.NoSuchProcess:
        return []


def _gone_pid() -> int:
    """A PID that no process has now (one that exited and was reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    assert not psutil.pid_exists(done.pid)
    return done.pid


def test_group_members_and_children_of_a_family(family) -> None:
    kids = processes.children(family.pid)
    assert _names(kids) == ["sleep", "sleep"]
    assert sorted(processes.group_members(family.pid)) == sorted([family.pid, *kids])
    assert processes.alive(family.pid) and all(processes.alive(k) for k in kids)


def test_a_zombie_is_dead_and_no_member() -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        poll(lambda: psutil.Process(exited.pid).status(), lambda s: s == psutil.STATUS_ZOMBIE, 10)
        assert psutil.pid_exists(exited.pid), "not reaped yet: a zombie"
        assert not processes.alive(exited.pid)
        assert processes.group_members(exited.pid) == []
    finally:
        exited.wait()


def test_a_vanished_process_is_skipped_never_an_error() -> None:
    pid = _gone_pid()
    assert not processes.alive(pid)
    assert processes.children(pid) == []
    assert processes.group_members(pid) == []
    assert processes.shm_regions([pid]) == set()


def test_shm_names_come_from_command_lines_and_open_files(shm_dir) -> None:
    """A stub names its region on its command line; the server holds the regions of its stubs open."""
    held = shm_dir / (processes.SHM_PREFIX + "held_open")
    held.write_bytes(b"\0" * 16)
    hold = "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(60)"
    stub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", REGION, "other-arg"])
    server = subprocess.Popen([sys.executable, "-c", hold, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        assert processes.shm_regions([stub.pid]) == {REGION}
        assert processes.shm_regions([server.pid]) == {held.name}
        assert processes.shm_regions([stub.pid, _gone_pid(), server.pid]) == {REGION, held.name}
    finally:
        for p in (stub, server):
            p.kill()
            p.wait()


def test_command_line_and_mapped_files_of_a_live_a_zombie_and_a_vanished_process(tmp_path) -> None:
    """What health.py and the lessons read of a stub: its arguments and the files it maps (psutil, not /proc)."""
    mapped = tmp_path / "region"
    mapped.write_bytes(b"\0" * 4096)
    code = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print('ready', flush=True); time.sleep(60)")
    live = subprocess.Popen([sys.executable, "-c", code, str(mapped)], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "ready"
        assert processes.command_line(live.pid) == [sys.executable, "-c", code, str(mapped)]
        assert str(mapped) in processes.mapped_files(live.pid)
        mapped.unlink()
        assert str(mapped) in processes.mapped_files(live.pid), "still mapped, under its old path (see the docstring)"
    finally:
        live.kill()
        live.wait()
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        poll(lambda: psutil.Process(exited.pid).status(), lambda s: s == psutil.STATUS_ZOMBIE, 10)
        assert processes.command_line(exited.pid) == []
    finally:
        exited.wait()
    gone = _gone_pid()
    assert processes.command_line(gone) == [] and processes.mapped_files(gone) == set()


@pytest.mark.parametrize("raised", [psutil.NoSuchProcess(1), psutil.ZombieProcess(1), psutil.AccessDenied(1)])
def test_a_process_that_goes_away_while_read_is_skipped(family, monkeypatch, raised) -> None:
    """psutil's errors for a process that exits (or turns zombie, or is not ours) between two reads."""
    kids = processes.children(family.pid)

    def fails(self, *args, **kwargs):
        raise raised

    monkeypatch.setattr(psutil.Process, "open_files", fails)
    assert processes.shm_regions(kids) == set()
    monkeypatch.setattr(psutil.Process, "cmdline", fails)
    assert processes.shm_regions(kids) == set()
    assert processes.command_line(kids[0]) == []
    monkeypatch.setattr(psutil.Process, "memory_maps", fails)
    assert processes.mapped_files(kids[0]) == set()
    monkeypatch.setattr(psutil.Process, "children", fails)
    assert processes.children(family.pid) == []
    monkeypatch.setattr(psutil.Process, "status", fails)
    # A process we may not read is taken to run (stopping it is then the kernel's to refuse).
    assert processes.alive(family.pid) is isinstance(raised, psutil.AccessDenied)


def test_group_members_skips_a_pid_that_exits_between_list_and_read(family, monkeypatch) -> None:
    gone, listed = _gone_pid(), psutil.pids()
    monkeypatch.setattr(psutil, "pids", lambda: [gone, *listed])
    assert family.pid in processes.group_members(family.pid)


def test_stop_group_stops_a_family_that_ignores_sigterm_and_cleans_its_regions(shm_dir) -> None:
    region = shm_dir / REGION
    region.write_bytes(b"\0")
    script = f"trap '' TERM; python3 -c 'import time; time.sleep(60)' {REGION} & sleep 60 & wait"
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        seen = poll(lambda: processes.shm_regions(processes.group_members(leader.pid)), bool, 10)
        assert seen == {REGION}, "the stub's command line names its region"
        assert processes.stop_group(leader.pid, 0.3, reap=leader.poll) == {REGION}
        assert leader.poll() is not None and processes.group_members(leader.pid) == []
        assert not region.exists()
    finally:
        processes.kill_group(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_pid_another_process_took_is_left_alone() -> None:
    """A server's PID, once the server is gone, may be a new process's (and its group's ID): stop_group and the
    watchdog name the server by its PID and start time, so the newcomer is neither signalled nor cleaned.
    The newcomer here: a group leader whose start time is not the one the caller knew."""
    newcomer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        born = processes.started_at(newcomer.pid)
        assert born is not None and not processes.reused(newcomer.pid, born)
        earlier = born - 100.0  # "the server" that had this PID before
        assert processes.reused(newcomer.pid, earlier)
        assert processes.stop_group(newcomer.pid, 0.3, reap=newcomer.poll, born=earlier) == set()
        assert newcomer.poll() is None, "stop_group signalled a process that only reused the PID"
        processes.stop_group(newcomer.pid, 5.0, reap=newcomer.poll)  # the control: by its own start time, stopped
        assert newcomer.wait(timeout=10) == -signal.SIGTERM
    finally:
        if newcomer.poll() is None:
            newcomer.kill()
            newcomer.wait()
