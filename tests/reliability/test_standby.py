"""``lab-backends serve --front-door --restart --standby``: a crash costs the other clients almost nothing.

One ``serve`` for the module, two tritonservers behind its door (lab_backends/server/standby.py). The
servers' PIDs come from ``servers.json`` (serve writes it after each start) and the one the gateway uses
from ``active.json`` (the gateway writes it on each switch), both in the door's folder: each kill is of
the server that is answering, by PID. The tests run in file order: the kills, then a sequence across a
kill, then both servers back with every model answering.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.gateway_failover import LOST
from lab_backends.server.processes import alive
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS
from tests.reliability.serve_process import Serve, copy_models, require_nginx

pytestmark = pytest.mark.server
MODELS = ("rel_double", "running_mean")
KILLS = 5
#: Each wait (a server back, the client's requests after a kill) is bounded by this.
WAIT_S = 120.0


@dataclass
class Pair:
    serve: Serve
    door_dir: Path
    killed: list[int] = field(default_factory=list)

    def servers(self) -> list[dict]:
        return json.loads((self.door_dir / "servers.json").read_text())

    def active_pid(self) -> int:
        return self.servers()[json.loads((self.door_dir / "active.json").read_text())["slot"]]["pid"]

    def both_up(self) -> list[dict]:
        """Both servers listed, alive and none of them one we killed (serve writes the file once one is ready)."""
        def read() -> list[dict]:
            try:
                return self.servers()
            except (OSError, ValueError):
                return []
        up = poll(read, lambda s: len(s) == 2 and all(e["pid"] and alive(e["pid"]) and e["pid"] not in self.killed
                                                      for e in s), WAIT_S, 0.1)
        assert len(up) == 2 and all(alive(e["pid"]) and e["pid"] not in self.killed for e in up), \
            f"both servers were not back within {WAIT_S:g} s: {up}\n{self.serve.err.read_text()[-2000:]}"
        return up

    def kill_active(self) -> int:
        pid = self.active_pid()
        os.kill(pid, signal.SIGKILL)
        self.killed.append(pid)
        return pid


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    require_nginx()
    tmp = tmp_path_factory.mktemp("standby")
    repo = copy_models({"rel_double": TEST_MODELS, "running_mean": MODEL_REPOSITORY}, tmp / "repo")
    serve = Serve(tmp, "--model-repository", str(repo), "--model", "running_mean", "--front-door", "--restart",
                  "--standby", "--admin-key-file", str(tmp / "admin.key"))
    try:
        assert re.search(r"standby +: tritonserver \(pid \d+\)", serve.text), serve.text
        access_log = re.search(r"front door: nginx \(pid \d+\), its log (\S+);", serve.text).group(1)
        yield Pair(serve, Path(access_log).parent)
    finally:
        serve.stop()
    assert serve.proc.returncode == 0, serve.err.read_text()[-2000:]


class SteadyClient:
    """A bounded loop of ``rel_double`` requests through the door, HTTP and gRPC in turn, ~50 a second."""

    def __init__(self, pair: Pair) -> None:
        self.http, self.grpc = pair.serve.http, pair.serve.grpc
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc)
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()
        deadline = time.monotonic() + 4 * WAIT_S  # bounded even if the test never says stop
        i = 0
        while not self.stop.is_set() and time.monotonic() < deadline:
            i += 1
            try:
                if i % 2:
                    status, answer = rest.request(f"http://{self.http}/v2/models/rel_double/infer", "POST", body,
                                                  {"Content-Type": "application/json"}, timeout=30)
                    out = json.loads(answer)["outputs"][0]["data"] if status == 200 else None
                    good = status == 200 and out == (2 * x).ravel().tolist()
                    why = f"HTTP {status}: {answer[:200]!r}"
                else:
                    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
                    inp.set_data_from_numpy(x)
                    result = client.infer("rel_double", [inp], client_timeout=30)
                    good = np.array_equal(result.as_numpy("OUTPUT0"), 2 * x)
                    why = "gRPC: a wrong answer"
            except (InferenceServerException, OSError, ValueError) as exc:
                good, why = False, f"{'HTTP' if i % 2 else 'gRPC'}: {exc}"
            if good:
                self.ok += 1
            else:
                self.failed.append(why)
            time.sleep(0.02)
        client.close()

    @property
    def total(self) -> int:
        return self.ok + len(self.failed)


def test_five_kills_of_the_active_server_cost_a_steady_client_under_2_percent(pair):
    """The active tritonserver SIGKILLed 5 times, each once the other is back (a learner's loop of crashers):
    the gateway sends every request on to the other server, and the client loses under 2 %."""
    pair.both_up()
    client = SteadyClient(pair)
    client.thread.start()
    try:
        began = time.monotonic()
        for _ in range(KILLS):
            pair.both_up()
            before = client.total
            pair.kill_active()
            # Requests after the kill, on the other server, before the next kill.
            poll(lambda: client.total, lambda n: n >= before + 20, WAIT_S, 0.05)
        pair.both_up()
        span = time.monotonic() - began
    finally:
        client.stop.set()
        client.thread.join(60)
    print(f"{KILLS} kills in {span:.1f} s; client: {client.ok} ok, {len(client.failed)} failed: {client.failed[:3]}")
    assert client.total >= 200, f"too few requests to judge: {client.total}"
    assert len(client.failed) < 0.02 * client.total, (len(client.failed), client.total, client.failed[:5])
    # serve writes the servers file (what both_up reads) before it reports "restarted": wait for the line.
    restarted = r"tritonserver [12] of 2: restarted: pid \d+"
    err = poll(pair.serve.err.read_text, lambda t: len(re.findall(restarted, t)) >= KILLS, WAIT_S, 0.1)
    assert len(re.findall(restarted, err)) >= KILLS, err[-2000:]


def _http_step(pair: Pair, cid: int, value: float, start: bool = False) -> tuple[int, dict]:
    body = json.dumps({"parameters": {"sequence_id": cid, "sequence_start": start},
                       "inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}).encode()
    status, answer = rest.request(f"http://{pair.serve.http}/v2/models/running_mean/infer", "POST", body,
                                  {"Content-Type": "application/json"}, timeout=30)
    return status, json.loads(answer)


def _grpc_step(client: grpcclient.InferenceServerClient, cid: int, value: float, start: bool = False) -> int:
    inp = grpcclient.InferInput("VALUE", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    result = client.infer("running_mean", [inp], sequence_id=cid, sequence_start=start, client_timeout=30)
    return int(result.as_numpy("COUNT").ravel()[0])


def test_a_sequence_across_a_kill_is_refused_as_lost_and_a_new_start_works(pair):
    """Its state died with its server: the next step is refused in one line, not answered from a fresh state."""
    pair.both_up()
    client = grpcclient.InferenceServerClient(pair.serve.grpc)
    try:
        assert _http_step(pair, 7001, 1.0, start=True)[0] == 200
        status, answer = _http_step(pair, 7001, 3.0)
        assert status == 200 and answer["outputs"][1]["data"] == [2], answer  # COUNT: state kept in one server
        assert _grpc_step(client, 7002, 5.0, start=True) == 1
        assert _grpc_step(client, 7002, 5.0) == 2
        pair.kill_active()
        status, answer = _http_step(pair, 7001, 5.0)
        assert (status, answer["error"]) == (400, LOST.format(cid=7001)), (status, answer)
        with pytest.raises(InferenceServerException) as lost:
            _grpc_step(client, 7002, 5.0)
        assert LOST.format(cid=7002) in str(lost.value) and "INVALID_ARGUMENT" in str(lost.value.status())
        # A new START works at once, on the other server, and its state holds.
        assert _http_step(pair, 7001, 2.0, start=True)[0] == 200
        assert _http_step(pair, 7001, 4.0)[1]["outputs"][1]["data"] == [2]
        assert _grpc_step(client, 7002, 1.0, start=True) == 1
        assert _grpc_step(client, 7002, 1.0) == 2
    finally:
        client.close()


#: Run inside serve's network namespace (as root) or here: each server ready, each model answers on each.
PROBE = """
import json, sys, urllib.request
for server in json.loads(sys.argv[1]):
    base = f"http://127.0.0.1:{server['http_port']}"
    assert urllib.request.urlopen(base + "/v2/health/ready", timeout=30).status == 200
    for model, body in json.loads(sys.argv[2]).items():
        with urllib.request.urlopen(urllib.request.Request(base + f"/v2/models/{model}/infer", data=body.encode(),
                                    headers={"Content-Type": "application/json"}), timeout=30) as answer:
            print(server["pid"], model, answer.status, json.loads(answer.read())["outputs"][0]["data"][:2])
"""


def test_after_the_kills_both_servers_are_back_and_every_model_answers_on_each(pair):
    """Both back (serve restarted each), each answers every model; the standby's dead stub is healed too
    (each server has a StubWatch of its own)."""
    servers = pair.both_up()
    slot = 1 - json.loads((pair.door_dir / "active.json").read_text())["slot"]  # the standby's
    healed = f"tritonserver {slot + 1} of 2: stub health: model 'rel_double' reloaded"
    stub = [p for p in psutil.Process(servers[slot]["pid"]).children(recursive=True)
            if "rel_double_0_0" in " ".join(p.cmdline())]
    assert len(stub) == 1, stub
    stub[0].kill()
    said = poll(pair.serve.err.read_text, lambda t: healed in t, WAIT_S, 0.2)
    assert healed in said, said[-2000:]
    bodies = {
        "rel_double": {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]},
        "running_mean": {"parameters": {"sequence_id": 7003, "sequence_start": True, "sequence_end": True},
                         "inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]},
    }
    inside = ["nsenter", f"--net=/proc/{pair.serve.proc.pid}/ns/net"] if os.geteuid() == 0 else []
    done = subprocess.run([*inside, sys.executable, "-c", PROBE, json.dumps(servers),
                           json.dumps({m: json.dumps(b) for m, b in bodies.items()})],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    for server in servers:
        assert f"{server['pid']} rel_double 200 [2.0, 2.0]" in lines, done.stdout
        assert f"{server['pid']} running_mean 200 [3.0]" in lines, done.stdout
    assert len(pair.killed) == KILLS + 1 and not any(alive(pid) for pid in pair.killed)
