"""What tests/class checks of each learner's sandbox (issue 38), with learners A, B and C of a running class.

The bodies of three tests of ``test_class_hub.py`` (which runs them after lesson 01, so every learner
has a running kernel): C cannot reach A's ports or shared memory; C's fork bomb and memory hog stop
at C's limits while A and B keep working; B's and C's sequences with the same ID stay apart.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandbox_probes import as_learner, in_kernel, kernel_files, kernel_pid, kernel_ports, learner_command

from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.server.processes import SHM_DIR
from lab_backends.waiting import poll

#: A region A creates in their /dev/shm, named like the Python backend's.
REGION = "triton_python_backend_shm_region_probe"
#: As A: a region in A's /dev/shm and a port A listens on (as A's embedded Triton does), held until stdin closes.
_HOLD = f"""
import os, socket, sys
with open("/dev/shm/{REGION}", "wb") as f:
    f.write(b"A's input tensor")
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
sys.stdin.read()
os.unlink("/dev/shm/{REGION}")
"""
#: Which of the ports given reach something from here, which of them this namespace itself listens on (a learner's
#: own kernel may hold the same port number as A's: reaching it says nothing about A), and what /dev/shm holds.
_LOOK = """
import json, os, socket, sys
reached = []
for port in map(int, sys.argv[1:]):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        reached.append(port)
    except OSError:
        pass
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        fields = row.split()
        if fields[3] == "0A":  # LISTEN
            listening.add(int(fields[1].rsplit(":", 1)[1], 16))
own = [port for port in reached if port in listening]
print(json.dumps({"reached": reached, "own": own, "shm": sorted(os.listdir("/dev/shm"))}))
"""


def isolation(room: Any, servers: dict[str, int]) -> None:
    a, _, c = list(room.learners)
    ports = kernel_ports(kernel_files(a)[-1])  # A's kernel of lesson 01, still running
    holder = subprocess.Popen(**learner_command(a, servers[a], _HOLD), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        ports.append(int(holder.stdout.readline()))
        seen = {who: json.loads(as_learner(who, servers[who], _LOOK, *map(str, ports)).stdout) for who in (a, c)}
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert seen[a]["reached"] == ports and REGION in seen[a]["shm"], f"the control failed: A sees {seen[a]}"
    foreign = [port for port in seen[c]["reached"] if port not in seen[c]["own"]]  # not C's own listeners
    assert foreign == [], f"{c} connected to {a}'s ports {foreign} (kernel: {ports[:5]})"
    assert REGION not in seen[c]["shm"] and not (SHM_DIR / REGION).exists(), f"{a}'s /dev/shm region is visible"
    for name, pid in servers.items():
        umask = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Umask:")]
        assert umask == ["Umask:\t0077"], f"{name}'s server runs with {umask}"


#: As A or B: echo inferences through the door for argv[1] seconds, 20 a second; how many succeeded.
_SEND = """
import json, os, sys, time
from lab_backends import rest
url = os.environ["TRITON_URL"] + "/v2/models/echo/infer"
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).encode()
ok, failed, end = 0, [], time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        status = rest.request(url, "POST", body, {"Content-Type": "application/json"}, timeout=10)[0]
    except OSError as exc:
        status = repr(exc)
    ok += status == 200
    failed += [] if status == 200 else [str(status)]
    time.sleep(0.05)
print(json.dumps({"ok": ok, "failed": failed[:5]}))
"""
#: In C's kernel, as a learner would start one: a fork bomb in a process of its own (``python bomb.py``), bounded by
#: us: it forks until refused, holds its children 4 s (A and B send meanwhile), then stops them. The kernel itself
#: does not fork at the limit: one holding a gRPC client (lesson 01's) stopped answering when it did (limits_notice.py).
_BOMB = """
import os, time
kids = []
try:
    while len(kids) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except BlockingIOError:
    print("refused after", len(kids), flush=True)
time.sleep(4)
for pid in kids:
    os.kill(pid, 9)
for pid in kids:
    os.waitpid(pid, 0)
"""
_FORK_BOMB = f"""
import subprocess, sys
print(subprocess.run([sys.executable, "-c", {_BOMB!r}], capture_output=True, text=True, timeout=60).stdout)
"""
#: In C's kernel: 6 GiB, every page written (bytearray zero-fills it).
_HOG = 'block = bytearray(6 << 30)\nprint("not stopped")'
BOUND_S = 30.0


def _while_others_send(room: Any, servers: dict[str, int], seconds: float, action: Any) -> tuple[Any, list[dict]]:
    """``action()`` while A and B send requests for ``seconds``; its result and what A and B saw."""
    a, b, _ = list(room.learners)
    with ThreadPoolExecutor(2) as pool:
        sending = [pool.submit(as_learner, who, servers[who], _SEND, str(seconds)) for who in (a, b)]
        time.sleep(2.0)  # their interpreters start
        result = action()
        sent = [json.loads(f.result().stdout) for f in sending]
    for who, seen in zip((a, b), sent):
        assert seen["ok"] > 0 and not seen["failed"], f"{who}'s requests failed while a limit stopped C: {seen}"
    return result, sent


def fork_bomb_and_memory_hog(room: Any, servers: dict[str, int]) -> None:
    _, _, c = list(room.learners)
    limits, (memory, pids, _) = LearnerLimits(), cgroups.learner_groups(c)
    connection = kernel_files(c)[-1]
    control = in_kernel(c, connection, "print(2 + 2)", BOUND_S)
    assert control["stdout"] == "4\n", f"C's kernel does not run a cell: {control}"
    started = time.monotonic()
    bomb, _ = _while_others_send(room, servers, 10, lambda: in_kernel(c, connection, _FORK_BOMB, BOUND_S))
    assert time.monotonic() - started < BOUND_S + 12, f"the fork bomb was not stopped in time: {bomb}"
    assert bomb["stdout"].startswith("refused after "), bomb
    count = int(bomb["stdout"].split()[2])
    assert 100 < count < limits.tasks, f"C's bomb forked {count} processes (limit {limits.tasks} tasks): {bomb}"
    assert bomb["status"] == "ok" and f"limit of {limits.tasks} processes and threads" in bomb["stderr"], bomb
    assert cgroups.counter(pids / "pids.events", "max") >= 1

    kernel, kills = kernel_pid(c, connection), cgroups.counter(memory / "memory.oom_control", "oom_kill")
    assert kernel, f"C's kernel for {connection} was not found"
    hog, _ = _while_others_send(room, servers, 10, lambda: in_kernel(c, connection, _HOG, BOUND_S))
    assert "not stopped" not in hog["stdout"], hog
    assert cgroups.counter(memory / "memory.oom_control", "oom_kill") > kills, "the memory limit did not stop C"
    back = poll(lambda: kernel_pid(c, kernel_files(c)[-1]), lambda pid: pid not in (None, kernel), BOUND_S, 0.5)
    assert back, "C's kernel was not restarted after the memory limit stopped it"
    after = in_kernel(c, kernel_files(c)[-1], "print('after')", BOUND_S)
    assert after["stdout"].strip() == "after", after
    assert "the class's memory limit (4 GiB per learner" in after["stderr"], after


#: As a learner, through the lessons' helper: sequence 7 started with argv[1] and, after a line of stdin, ended with
#: argv[2]; each answer printed as "mean MEAN COUNT".
_SEQUENCE = """
import sys
from lab_backends.client import sequences
from lab_backends.server.triton_server import TritonServer
server = TritonServer(models=["running_mean"]).start()
print("mean", *sequences.step(server, 7, float(sys.argv[1]), start=True), flush=True)
sys.stdin.readline()
print("mean", *sequences.step(server, 7, float(sys.argv[2]), end=True), flush=True)
"""


def sequences_apart(room: Any, servers: dict[str, int]) -> None:
    _, b, c = list(room.learners)
    mine = subprocess.Popen(**learner_command(b, servers[b], _SEQUENCE, "2.0", "4.0"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = ""
        while mine.poll() is None and not line.startswith("mean "):
            line = mine.stdout.readline()
        assert line.split() == ["mean", "2.0", "1"], (line, mine.stderr.read() if mine.poll() is not None else "")
        theirs = [r for r in as_learner(c, servers[c], _SEQUENCE, "500.0", "700.0", stdin="\n").stdout.splitlines()
                  if r.startswith("mean ")]
        assert theirs == ["mean 500.0 1", "mean 600.0 2"], theirs  # C's own sequence 7
        out, err = mine.communicate("\n", timeout=60)
    finally:
        if mine.poll() is None:
            mine.kill()
    assert "mean 3.0 2" in out.splitlines(), f"B's sequence 7 saw C's values: {out} {err[-500:]}"
