"""#46: a learner's connections are their own cost: the forwarders that relay them run within that learner's limits.

In a real class (conftest.py's, by the README's commands), A and B get their servers from the hub's spawn
page (as a browser's login does, without one: the forwarders are what is tested). A opens 5,000 idle
connections to the front door through their forwarder: the door gets at most A's connection cap of them,
the rest are refused at once (refused, or reset right after they connect), and the socat processes that
serve A are in A's cgroups (their tasks bounded by the forwarders' ``pids.max``, A's relays inside the
namespace running as A). Meanwhile B sends a request through the door, and A's JupyterLab still answers
through the hub's proxy (the inward pair is outside the cap). After A closes them, A's forwarders are back
to what they were, and A's next request goes through.
Called by test_class_hub.py on its class (one class per run of tests/class: two classes at once would see each
other's processes): about 5 s (two spawns, the flood, the checks).
"""

from __future__ import annotations

import http.cookiejar
import json
import pwd
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from sandbox_probes import as_learner, learner_command

from lab_backends import rest
from lab_backends.classroom import cgroups
from lab_backends.classroom.cgroups import LearnerLimits
from lab_backends.classroom.network import RESTART_S, SOCKET_ROOT, namespace_name
from lab_backends.waiting import poll

SPAWN_DEADLINE_S = 180
FLOOD = 5000
#: As the learner, in their namespaces and cgroups: ``FLOOD`` connections to the door's HTTP port (bounded loop),
#: each connection's fate, then an HTTP request on every one still open (the door must answer it: relayed end to
#: end); held until a line on stdin, then all closed.
_FLOOD = """
import json, os, resource, select, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
port, count = int(os.environ["TRITON_URL"].rsplit(":", 1)[1]), int(sys.argv[1])
opened, refused, timeouts, slowest = [], 0, 0, 0.0
started = time.monotonic()
for _ in range(count):
    t = time.monotonic()
    try:
        opened.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except TimeoutError:
        timeouts += 1  # a connection that hangs: what the forwarder must never do
    except OSError:
        refused += 1
    slowest = max(slowest, time.monotonic() - t)
    if time.monotonic() - started > 90:
        break  # bounded even if every connection hung
loop_s = time.monotonic() - started

def closed(s):
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(p.poll(0))

# The refused ones that connected first: the forwarder closes (or resets) them as its listener exits.
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    live = [s for s in opened if not closed(s)]
    time.sleep(1.0)
    if len([s for s in opened if not closed(s)]) == len(live):
        break
answered = 0
for s in live:
    s.settimeout(10)
    s.sendall(b"GET /v2/health/ready HTTP/1.1\\r\\nHost: door\\r\\n\\r\\n")
    try:
        answered += s.recv(64).startswith(b"HTTP/1.1 ")
    except OSError:
        pass
print(json.dumps({"loop_s": round(loop_s, 2), "slowest_s": round(slowest, 2), "refused": refused, "timeouts": timeouts,
                  "reset": len(opened) - len(live), "live": len(live), "answered": answered}), flush=True)
sys.stdin.readline()
for s in opened:
    s.close()
"""
#: As a learner: one echo inference through the door (their forwarder), its HTTP status.
_REQUEST = """
import json, os
from lab_backends import rest
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).encode()
print(rest.request(os.environ["TRITON_URL"] + "/v2/models/echo/infer", "POST", body,
                   {"Content-Type": "application/json"}, timeout=30)[0])
"""


def _spawn(room: Any, name: str) -> None:
    """Log in as ``name`` (their Unix password, PAM) and open the hub's spawn page, as a browser does: the hub
    starts their server (no options form). Redirects are not followed: the pages after it wait for the server."""
    jar = http.cookiejar.CookieJar()

    class _Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _Stay())
    opener.open(f"{room.hub_url}/hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")  # the login form's
    form = urllib.parse.urlencode({"username": name, "password": room.learners[name], "_xsrf": xsrf}).encode()
    for url, data in ((f"{room.hub_url}/hub/login", form), (f"{room.hub_url}/hub/spawn", None)):
        try:
            status, where = opener.open(url, data=data, timeout=120).status, ""
        except urllib.error.HTTPError as exc:
            status, where = exc.code, exc.headers.get("Location", "")
        assert status in (200, 302) and "/login" not in where, f"{name}: {url} answered {status} {where}"


def _answers(room: Any, name: str) -> bool:
    """The learner's Jupyter Server answers through the hub's proxy (``/api`` needs no login): their inward pair."""
    try:
        return rest.request(f"{room.hub_url}/user/{name}/api", timeout=10)[0] == 200
    except OSError:
        return False


def _server(name: str) -> int:
    found = [p.pid for p in psutil.process_iter(["username", "cmdline"])
             if p.info["username"] == name and p.name() != "dumb-init"
             and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or [])]
    assert len(found) == 1, f"{name}'s server: {found}"
    return found[0]


def _forwarders(name: str) -> list[psutil.Process]:
    """Every socat process on this machine that serves ``name`` (its command line names their socket folder)."""
    mark = f"{SOCKET_ROOT / namespace_name(name)}/"
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "socat" and any(mark in a for a in p.info["cmdline"] or []):
            found.append(p)
    return found


def _cgroups_of(pid: int) -> dict[str, str]:
    rows = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    return {name: path for _, names, path in rows for name in names.split(",")}


def _machine_tasks() -> int:
    """Every task on this machine (``/proc/loadavg``'s total of scheduling entities: processes and threads)."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.NoSuchProcess:
        return []


def _tasks(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.num_threads()
        except psutil.NoSuchProcess:
            pass
    return total


def learner_connections(classroom: Any) -> None:
    room = classroom
    a, b = list(room.learners)[:2]
    started = time.monotonic()
    for name in (a, b):
        _spawn(room, name)
    for name in (a, b):
        assert poll(lambda: _answers(room, name), bool, SPAWN_DEADLINE_S, 0.5), f"{name}'s server is not ready"
    servers = {name: _server(name) for name in (a, b)}
    spawned_s = time.monotonic() - started
    limits = LearnerLimits()
    pids = cgroups.forwarders_group(a)
    assert int((pids / "pids.max").read_text()) == limits.forwarder_tasks
    halves = [pids / half for half in cgroups.HALVES]
    assert all(int((h / "pids.max").read_text()) == limits.half_tasks for h in halves)
    before = {p.pid for p in _forwarders(a)}
    refusals = sum(cgroups.counter(h / "pids.events", "max") for h in halves)
    machine = _machine_tasks()
    flood = subprocess.Popen(**learner_command(a, servers[a], _FLOOD, str(FLOOD)), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = flood.stdout.readline()
        assert line, f"A's flood ended: {flood.stderr.read()[-2000:]}"
        seen = json.loads(line)
        held = _forwarders(a)
        # The cap is on the outward relays' group (/out-: A's server to the door); the inward ones (the hub to A's
        # JupyterLab) live in A's own group, uncapped, and their number follows the hub's polling.
        held_tasks = _tasks([p for p in held if any('/out-' in part for part in _cmdline(p))])
        machine_during = _machine_tasks()
        # Meanwhile B, through B's own forwarder, and A's own server, through A's (the hub's API answers it).
        b_status = as_learner(b, servers[b], _REQUEST).stdout.strip()
        a_lab = _answers(room, a)
        checked, as_a = 0, []
        for p in held:  # every process that serves A: in A's groups (outward: the capped pids group)
            try:
                groups, line, uid = _cgroups_of(p.pid), " ".join(p.cmdline()), p.uids().real
            except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
                continue  # gone since it was listed: a relay whose client closed, a listener restarting at the cap
            half = "inside" if "TCP-LISTEN" in line else "outside"  # an outward pair listens on TCP inside
            pids_group = f"/lab-class/{a}/{cgroups.FORWARDERS}/{half}" if "/out-" in line else f"/lab-class/{a}"
            assert groups["pids"].endswith(pids_group) and groups["memory"].endswith(f"/lab-class/{a}") and \
                groups["cpu"].endswith(f"/lab-class/{a}"), (line, groups)
            checked += 1
            as_a += [p] if uid == pwd.getpwnam(a).pw_uid else []  # the relays inside A's namespace
        assert checked >= len(held) // 2, f"only {checked} of A's {len(held)} forwarders could be read"
    finally:
        if flood.poll() is None:
            flood.communicate("\n", timeout=60)
    print(f"A's flood: {seen}; A's forwarders: {len(held)} processes, {held_tasks} outward tasks (cap "
          f"{limits.forwarder_tasks}); machine tasks {machine} -> {machine_during}; spawn {spawned_s:.0f} s")
    assert seen["refused"] + seen["timeouts"] + seen["reset"] + seen["live"] == FLOOD, seen
    assert limits.connections // 2 <= seen["live"] <= limits.connections, f"A held {seen['live']} connections: {seen}"
    assert len(as_a) >= seen["live"], f"A's {seen['live']} connections are relayed by {len(as_a)} processes of A's"
    assert seen["answered"] == seen["live"], f"some of A's held connections were not relayed to the door: {seen}"
    # Refused at once: never a hang (at worst one SYN the kernel dropped from a full queue, sent again 1 s later).
    assert seen["timeouts"] == 0 and seen["slowest_s"] < 8, f"a refused connection of A's waited: {seen}"
    assert held_tasks <= limits.forwarder_tasks + 1, f"A's outward forwarders held {held_tasks} tasks"
    assert sum(cgroups.counter(h / "pids.events", "max") for h in halves) > refusals, \
        "the cap refused nothing: the control"
    assert b_status == "200", f"B's request failed while A flooded: {b_status}"
    assert a_lab, "A's JupyterLab stopped answering through the hub while A flooded (the inward pair is uncapped)"
    # Freed: A's forwarders back to what they were (the hub's API connections of A's server may differ by a few).
    after = poll(lambda: _forwarders(a), lambda procs: len(procs) <= len(before) + 2, 30, 0.2)
    assert len(after) <= len(before) + 2, f"A's forwarders were not freed: {len(before)} -> {len(after)}"
    # Back within a few restarts: a listener that exited at the cap sleeps RESTART_S before it listens again, and
    # with a cap per half the Unix side's may be the one asleep, which a request then finds as a reset connection.
    back = poll(lambda: as_learner(a, servers[a], _REQUEST, check=False).stdout.strip(), lambda said: said == "200",
                10 * RESTART_S + 5, 0.5)
    assert back == "200", f"A's forwarder did not come back: {back!r}"
    print(f"freed: A's forwarders {len(before)} -> {len(held)} -> {len(after)} processes; "
          f"test {time.monotonic() - started:.0f} s")
