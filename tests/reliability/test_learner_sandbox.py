"""A class learner's sandbox, piece by piece, on the real kernel: network namespace, forwarders, cgroups, notices.

tests/class runs the whole class with these on; here each piece is checked alone, fast, and with
the failures it must produce forced (a tiny memory limit, a task limit of 40), which a class would
meet only when a learner misbehaves. Root only (network namespaces and cgroups need it), as in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import GIB, LearnerLimits
from lab_backends.classroom.network import NETNS_DIR, SOCKET_ROOT, LearnerNetwork, close_network, open_network
from lab_backends.server.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and cgroups need root (CI runs as root)")


def _connect(port: int, prefix: list[str] = ()) -> str:
    """From the namespace ``prefix`` enters (none: this one): what 127.0.0.1:``port`` answers, or the error."""
    code = textwrap.dedent(f"""
        import socket
        try:
            with socket.create_connection(("127.0.0.1", {port}), timeout=5) as s:
                s.sendall(b"ping")
                print(s.recv(64).decode() or "closed")
        except OSError as exc:
            print(type(exc).__name__)
    """)
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _echo_server(port: int, prefix: list[str] = ()) -> subprocess.Popen:
    """A one-line TCP server on 127.0.0.1:``port`` that answers ``pong:<port>`` (in the namespace ``prefix`` enters)."""
    code = textwrap.dedent(f"""
        import socket
        srv = socket.create_server(("127.0.0.1", {port}))
        print("listening", flush=True)
        while True:
            conn, _ = srv.accept()
            conn.recv(64); conn.sendall(b"pong:{port}"); conn.close()
    """)
    proc = subprocess.Popen([*prefix, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


#: A server that answers every two bytes with one, and a client that times 20 write-write-read exchanges through
#: the forwarder (both ends with TCP_NODELAY, as gRPC's): the pattern that Nagle's algorithm in a forwarder
#: without TCP_NODELAY stalls until the peer's delayed ACK (40 ms or more each on Linux).
_PAIRS_SERVER = """
import socket
srv = socket.create_server(("127.0.0.1", {port}))
print("listening", flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    got = b""
    while len(got) < 2:
        chunk = conn.recv(2 - len(got))
        if not chunk:
            raise SystemExit
        got += chunk
    conn.sendall(b"k")
"""
_PAIRS_CLIENT = """
import socket, statistics, time
s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(20):
    t = time.perf_counter()
    s.sendall(b"a"); s.sendall(b"b"); s.recv(1)
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1000)
"""


def test_the_forwarders_do_not_hold_small_writes() -> None:
    """A request sent in two small writes crosses the forwarders at once (median well under the 40 ms of a
    delayed ACK; measured 37 ms p50 for lesson 01's requests before the forwarders set TCP_NODELAY)."""
    (port,) = free_ports(1)
    server = subprocess.Popen([sys.executable, "-c", _PAIRS_SERVER.format(port=port)], stdout=subprocess.PIPE,
                              text=True)
    assert server.stdout.readline().strip() == "listening"
    net = open_network(f"lbn{os.getpid()}", inward=[], outward=[port])
    try:
        median_ms = float(subprocess.run([*net.enter(), sys.executable, "-c", _PAIRS_CLIENT.format(port=port)],
                                         capture_output=True, text=True, timeout=60).stdout)
    finally:
        close_network(net)
        server.kill()
        server.wait()
    assert median_ms < 20, f"a two-write request took {median_ms:.1f} ms (median) through the forwarders: Nagle?"


def _socats() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "socat"}


def test_a_learner_namespace_reaches_only_its_forwarded_ports_and_closes_without_a_trace() -> None:
    before = _socats()
    outward, hidden_here, inward, hidden_inside = free_ports(4)
    user = f"lbt{os.getpid()}"
    servers = [_echo_server(outward), _echo_server(hidden_here)]
    net = open_network(user, inward=[inward], outward=[outward])
    try:
        servers += [_echo_server(inward, net.enter()), _echo_server(hidden_inside, net.enter())]
        # out of the namespace: only the forwarded port of the machine (the door's, the hub's API)
        assert _connect(outward, net.enter()) == f"pong:{outward}"
        assert _connect(hidden_here, net.enter()) == "ConnectionRefusedError"
        # into it: only the learner's server port (for the proxy); their kernels' and embedded Triton's are not
        assert _connect(inward) == f"pong:{inward}"
        assert _connect(hidden_inside) == "ConnectionRefusedError"
        assert (SOCKET_ROOT.stat().st_mode & 0o777) == 0o700 and (net.socket_dir.stat().st_mode & 0o777) == 0o700
        state = net.to_state()
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()
    close_network(LearnerNetwork.from_state(state))  # as a restarted hub does, from the database
    assert not (NETNS_DIR / net.name).exists() and not net.socket_dir.exists()
    assert _socats() <= before, "a forwarder outlived close_network"


def test_a_stale_namespace_of_the_same_learner_is_replaced() -> None:
    user = f"lbs{os.getpid()}"
    (port,) = free_ports(1)
    first = open_network(user, inward=[], outward=[port])
    second = open_network(user, inward=[], outward=[port])  # the hub lost track of the first: no "port in use"
    try:
        assert second.name == first.name and (NETNS_DIR / second.name).exists()
        assert not any(psutil.pid_exists(g) and psutil.Process(g).status() != psutil.STATUS_ZOMBIE
                       for g in first.groups if g not in second.groups)
    finally:
        close_network(second)


#: Run inside a learner's groups: a bounded fork loop until refused, the notice for it, then the same for memory.
_INSIDE = """
import os, sys, time
sys.path.insert(0, {root!r})
from lab_backends.classroom.limits_notice import Notices
notices = Notices()
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30); os._exit(0)
        kids.append(pid)
    print("never refused")
except BlockingIOError as exc:
    print("refused after", len(kids))
    print(notices.tasks(exc))
finally:
    for pid in kids:
        os.kill(pid, 9); os.waitpid(pid, 0)
"""


def _in_groups(groups: list[Path], code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cgroups.join_command(groups), sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=60)


def test_the_class_weighs_its_learners_shares_added_up_against_the_rest_of_the_machine() -> None:
    """Under the default 1024 all learners together weighed one busy process elsewhere (cgroups.weigh_class)."""
    users = [f"lbw{os.getpid()}a", f"lbw{os.getpid()}b"]
    parent = cgroups.own_group("cpu") / cgroups.PARENT
    try:
        for user in users:
            cgroups.create(user, LearnerLimits(cpu_shares=4096))
        # Other tests' learners may come and go meanwhile: they only ever add to the sum.
        assert int((parent / "cpu.shares").read_text()) >= 2 * 4096
    finally:
        for user in users:
            cgroups.remove(user)
    assert not any(g.exists() for user in users for g in cgroups.learner_groups(user))


def test_the_task_limit_refuses_a_fork_bomb_and_the_notice_names_it() -> None:
    user = f"lbc{os.getpid()}"
    groups = cgroups.create(user, LearnerLimits(memory_bytes=GIB, tasks=40, cpu_shares=512))
    try:
        assert (groups[1] / "pids.max").read_text().strip() == "40"
        assert (groups[2] / "cpu.shares").read_text().strip() == "512"
        done = _in_groups(groups, _INSIDE.format(root=str(ROOT)))
        assert done.returncode == 0, done.stderr
        refused, notice = done.stdout.strip().splitlines()
        assert refused.startswith("refused after") and int(refused.split()[-1]) < 40, done.stdout
        assert notice.startswith("BlockingIOError: the class's limit of 40 processes and threads"), notice
        assert cgroups.counter(groups[1] / "pids.events", "max") >= 1
    finally:
        cgroups.remove(user)
    assert not any(g.exists() for g in groups)


_HOG = """
import sys
sys.path.insert(0, {root!r})
from lab_backends.classroom import limits_notice
limits_notice.SEEN = __import__("pathlib").Path({seen!r})
if sys.argv[-1] == "hog":
    block = bytearray(512 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    print("not stopped")
else:
    notices = limits_notice.Notices()
    print(notices.memory_kills())
    print(notices.memory_kills())
"""


def test_the_memory_limit_stops_a_hog_and_the_next_kernel_says_so(tmp_path: Path) -> None:
    user = f"lbm{os.getpid()}"
    groups = cgroups.create(user, LearnerLimits(memory_bytes=128 << 20, tasks=64))
    code = _HOG.format(root=str(ROOT), seen=str(tmp_path / "seen.json"))
    try:
        hog = _in_groups(groups, code, "hog")
        assert hog.returncode == -9 and "not stopped" not in hog.stdout, (hog.returncode, hog.stdout, hog.stderr)
        assert cgroups.counter(groups[0] / "memory.oom_control", "oom_kill") >= 1
        after = _in_groups(groups, code).stdout.strip().splitlines()
        assert after[0].startswith("the class's memory limit (0.125 GiB per learner"), after
        assert after[1] == "None", "the same kill was reported twice"
    finally:
        cgroups.remove(user)
