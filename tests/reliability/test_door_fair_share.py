"""Each learner's share of the front door (``serve --front-door --learner-secret-file``), on a real server.

One ``serve`` for the module with a deliberately small share: 2 requests in flight and 2 a second
per learner, no burst, so each limit can be reached by a handful of requests. Each test uses
learner names of its own, so its requests fill no other test's share. A request is told to be the
door's refusal by the door's own wording, and the limit that refused it by nginx's error log
("limiting connections" for the requests in flight, "limiting requests" for the rate).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends import learner, rest
from lab_backends.client import protocol
from lab_backends.client.with_key import BOOT_DIR
from lab_backends.measure.loadgen.payloads import http_request_bytes
from lab_backends.server.admin import write_key_file
from lab_backends.waiting import poll
from tests.reliability.serve_process import ROOT, Serve, require_nginx

pytestmark = pytest.mark.server
LIMITED = "the front door limits each learner"
IN_FLIGHT, RATE = 2, 2
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})


@dataclass
class SharedDoor:
    serve: Serve
    secret: str
    access_log: Path

    @property
    def infer_url(self) -> str:
        return f"http://{self.serve.http}/v2/models/rel_double/infer"

    def headers(self, name: str, token: str | None = None) -> dict[str, str]:
        return {learner.LEARNER_HEADER: name, learner.TOKEN_HEADER: token or learner.token_for(self.secret, name),
                "Content-Type": "application/json"}

    def infer(self, name: str, token: str | None = None) -> tuple[int, bytes]:
        return rest.request(self.infer_url, "POST", BODY.encode(), self.headers(name, token), timeout=30)

    def logged(self, marker: str, count: int) -> list[str]:
        """The access log's lines holding ``marker``, once ``count`` are there (nginx logs after answering)."""
        def lines() -> list[str]:
            return [line for line in self.access_log.read_text().splitlines() if marker in line]
        return poll(lines, lambda found: len(found) >= count, 10, 0.05)

    def limited(self, which: str) -> int:
        """How many refusals nginx's error log holds for one limit ("connections" or "requests")."""
        return (self.access_log.parent / "error.log").read_text().count(f"limiting {which}")


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    require_nginx()
    tmp = tmp_path_factory.mktemp("fair")
    secret = learner.new_secret()
    write_key_file(tmp / "learners.secret", secret)
    serve = Serve(tmp, "--front-door", "--admin-key-file", str(tmp / "admin.key"),
                  "--learner-secret-file", str(tmp / "learners.secret"), "--learner-in-flight", str(IN_FLIGHT),
                  "--learner-rate", str(RATE), "--learner-burst", "0")
    try:
        log = next(line.split("its log ")[1].split(";")[0] for line in serve.text.splitlines() if "front door:" in line)
        yield SharedDoor(serve, secret, Path(log))
    finally:
        serve.stop()


def test_a_learner_is_named_in_the_log_only_with_their_own_token(door):
    ada = door.headers("ada")
    assert door.infer("ada")[0] == 200
    # bob's token, or another class's: nobody's, refused in a class (issue 46: no anonymous share beside one's own)
    assert door.infer("ada", token=learner.token_for(door.secret, "bob"))[0] == 401
    time.sleep(1.0 / RATE + 0.1)
    assert door.infer("ada", token=learner.token_for("another-class-secret-0123456789", "ada"))[0] == 401
    lines = door.logged("POST /v2/models/rel_double/infer", 3)
    assert [line.split("learner=")[1].split()[0] for line in lines[-3:]] == ["ada", "-", "-"], lines
    assert ada[learner.TOKEN_HEADER] not in door.access_log.read_text()  # the token is never logged


def test_requests_in_flight_over_the_share_get_429_and_another_learner_is_answered(door):
    """Two of carol's requests are held open (headers sent, body not): her third is refused, bob's passes."""
    held, before = [], door.limited("connections")
    try:
        for _ in range(IN_FLIGHT):
            held.append(_hold_open(door, "carol"))
            time.sleep(1.0 / RATE + 0.1)  # keeps within the rate: only the requests in flight can refuse
        status, body = door.infer("carol")
        assert status == 429 and LIMITED in json.loads(body)["error"] and "learner carol" in json.loads(body)["error"]
        assert door.limited("connections") == before + 1
        assert door.infer("bob")[0] == 200
    finally:
        for sock in held:
            sock.close()
    time.sleep(1.0 / RATE + 0.1)
    assert poll(lambda: door.infer("carol")[0], lambda s: s == 200, 10, 0.6) == 200  # her share is back


def test_requests_over_the_rate_get_429_and_the_bound_follows_the_time_they_took(door):
    """10 of dana's requests at once: over 2 a second with no burst, at most 1 + 2 x (their spread) pass."""
    sends, before = 10, door.limited("requests")
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(sends) as pool:
        statuses = list(pool.map(lambda _: door.infer("dana")[0], range(sends)))
    spread = time.monotonic() - t0
    passed = statuses.count(200)
    assert set(statuses) <= {200, 429}, statuses
    assert 1 <= passed <= 2 + RATE * spread, (statuses, spread)  # never more than the rate allows
    assert door.limited("requests") == before + sends - passed
    assert door.infer("erin")[0] == 200  # another learner's share is untouched


def test_grpc_calls_over_the_share_get_resource_exhausted_with_the_doors_message(door):
    client = grpcclient.InferenceServerClient(door.serve.grpc)
    headers = {k: v for k, v in door.headers("fay").items() if k != "Content-Type"}
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 16), "float32"))
    calls, errors = 6, []
    t0 = time.monotonic()
    for _ in range(calls):  # back to back: over 2 a second with no burst
        try:
            client.infer("rel_double", inputs, headers=headers)
        except InferenceServerException as exc:
            errors.append(exc)
    spread = time.monotonic() - t0
    assert calls - len(errors) <= 2 + RATE * spread, (errors, spread)  # the same bound as over HTTP
    assert all(LIMITED in str(e) and "RESOURCE_EXHAUSTED" in str(e.status()) for e in errors), errors
    lines = door.logged("/inference.GRPCInferenceService/ModelInfer", calls)
    assert sum("learner=fay" in line for line in lines) == calls, lines


def test_an_unchanged_tritonclient_script_in_a_learners_environment_carries_their_identity(door, tmp_path):
    """The hub's variables and the boot folder on PYTHONPATH: every tritonclient call is the learner's."""
    script = tmp_path / "client.py"
    script.write_text(
        "import time, tritonclient.http as h, tritonclient.grpc as g\n"
        f"assert h.InferenceServerClient({door.serve.http!r}).is_server_ready()\n"
        f"time.sleep({1.0 / RATE + 0.1})  # within the share's rate\n"
        f"assert g.InferenceServerClient({door.serve.grpc!r}).is_server_ready()\n")
    env = {**os.environ, "PYTHONPATH": f"{BOOT_DIR}{os.pathsep}{ROOT}", learner.LEARNER_VAR: "gus",
           learner.TOKEN_VAR: learner.token_for(door.secret, "gus")}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = door.logged("learner=gus", 2)
    assert any("GET /v2/health/ready" in line for line in lines) and any("ServerReady" in line for line in lines)


@dataclass(frozen=True)
class _Endpoints:
    """Where the hand-made clients send (they read only a server's URLs)."""

    http_url: str
    grpc_url: str


def test_the_hand_made_clients_carry_the_learners_identity_too(door, monkeypatch):
    """The lessons' own wire-level clients (client/protocol.py) and the load generator, in a learner's environment."""
    monkeypatch.setenv(learner.LEARNER_VAR, "hal")
    monkeypatch.setenv(learner.TOKEN_VAR, learner.token_for(door.secret, "hal"))
    where = _Endpoints(door.serve.http, door.serve.grpc)
    x = {"INPUT0": np.ones((1, 16), np.float32)}
    assert protocol.http_exchange(where, "rel_double", x).status == 200
    time.sleep(1.0 / RATE + 0.1)
    protocol.grpc_exchange(where, "rel_double", x)
    lines = door.logged("learner=hal", 2)
    assert any("POST /v2/models/rel_double/infer" in line for line in lines), lines
    assert any("GRPCInferenceService/ModelInfer" in line for line in lines), lines
    message = http_request_bytes(door.serve.http, "rel_double", x)
    assert f"lab-learner: hal\r\nlab-learner-token: {learner.token_for(door.secret, 'hal')}\r\n".encode() in message


def _hold_open(door: SharedDoor, name: str) -> socket.socket:
    """An inference request whose headers are sent and whose body is not: it stays in flight at the door."""
    host, port = door.serve.http.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in door.headers(name).items())
    sock.sendall(f"POST /v2/models/rel_double/infer HTTP/1.1\r\nHost: {host}\r\n{head}"
                 f"Content-Length: {len(BODY)}\r\n\r\n{BODY[:10]}".encode())
    return sock
