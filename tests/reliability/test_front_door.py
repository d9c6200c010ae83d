"""``lab-backends serve --front-door``: nginx refuses what would crash or fool tritonserver, on a real one.

One ``serve --front-door --admin-key-file K --restart`` for the module (its tests read and write
nothing another needs, but the last one crashes tritonserver on purpose). Each refusal is told
apart from Triton's own answer by the door's wording ("the front door refuses ..."), so a test
cannot pass on a refusal that came from Triton.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.notebook import RESTARTING
from lab_backends.server.netns import network_namespace
from lab_backends.server.ports import port_is_free
from lab_backends.server.processes import alive, group_members
from lab_backends.waiting import poll
from tests.reliability.serve_process import Serve, require_nginx
from tests.reliability.test_crashes import FORM_ENCODED
from tests.reliability.test_security import GRPC_RESTRICTED, HTTP_RESTRICTED
from tests.reliability.test_serve_admin import _flows

pytestmark = pytest.mark.server
DOOR = "the front door refuses"


@dataclass
class Door:
    """The running ``serve --front-door`` and what its banner says about the door."""

    serve: Serve
    key: str
    nginx_pid: int
    access_log: Path
    triton_ports: tuple[int, int]

    @property
    def url(self) -> str:
        return f"http://{self.serve.http}"

    @property
    def http_headers(self) -> dict[str, str]:
        return {"admin-key": self.key}

    @property
    def grpc_headers(self) -> dict[str, str]:
        return {"triton-grpc-protocol-admin-key": self.key}


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    require_nginx()
    tmp = tmp_path_factory.mktemp("door")
    serve = Serve(tmp, "--front-door", "--admin-key-file", str(tmp / "admin.key"), "--restart")
    try:
        found = re.search(r"front door: nginx \(pid (\d+)\), its log (\S+); tritonserver's own ports (\d+) and (\d+)",
                          serve.text)
        assert found, serve.text
        yield Door(serve, (tmp / "admin.key").read_text().strip(), int(found.group(1)), Path(found.group(2)),
                   (int(found.group(3)), int(found.group(4))))
    finally:
        serve.stop()
    assert serve.proc.returncode == 0
    assert not alive(int(found.group(1))), "serve stopped, its nginx did not"


def _ready(door: Door) -> int:
    return rest.request(f"{door.url}/v2/health/ready", timeout=5)[0]


def test_a_4mib_form_encoded_post_is_refused_five_times_and_tritonserver_never_sees_it(door):
    for _ in range(5):
        status, body = rest.request(f"{door.url}/v2/health/ready", "POST", FORM_ENCODED,
                                    {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 415 and DOOR in json.loads(body)["error"], (status, body[:200])
        assert _ready(door) == 200
    assert alive(door.serve.pid), "tritonserver died behind the door"
    assert "restarted" not in door.serve.err.read_text()
    def refused() -> list[str]:
        return [line for line in door.access_log.read_text().splitlines() if '"POST /v2/health/ready' in line]

    # nginx logs a request after its answer is sent (the log phase): a quiet clone's run read 3 of 5 lines.
    lines = poll(refused, lambda found: len(found) >= 5, 10, 0.05)
    assert len(lines) == 5 and all(" 415 " in line and "upstream=-" in line for line in lines), lines


def test_a_body_over_the_limit_gets_413_before_tritonserver_reads_it(door):
    conf = (door.access_log.parent / "nginx.conf").read_text()
    limit = int(re.search(r"client_max_body_size (\d+);", conf).group(1))
    status, body = rest.request(f"{door.url}/v2/models/rel_double/infer", "POST", b" " * (limit + 1),
                                {"Content-Type": "application/json"})
    assert status == 413 and f"over {limit} bytes" in json.loads(body)["error"]
    request = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
    status, body = rest.request(f"{door.url}/v2/models/rel_double/infer", "POST", json.dumps(request).encode(),
                                {"Content-Type": "application/json"})
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2.0] * 16


@pytest.mark.parametrize("api", sorted(HTTP_RESTRICTED))
def test_the_door_checks_the_key_of_every_restricted_http_api(door, api):
    method, path, body = HTTP_RESTRICTED[api]
    for headers in ({}, {"admin-key": "wrong-" + "x" * 16}):
        status, answer = rest.request(door.url + path, method, body, headers)
        assert status == 403 and DOOR in json.loads(answer)["error"], (api, headers, answer)
    status, answer = rest.request(door.url + path, method, body, door.http_headers)
    assert status == 200, (api, answer)


@pytest.mark.parametrize("api", sorted(GRPC_RESTRICTED))
def test_the_door_checks_the_key_of_every_restricted_grpc_method(door, api):
    call = GRPC_RESTRICTED[api]
    client = grpcclient.InferenceServerClient(door.serve.grpc)
    try:
        for headers in (None, {"triton-grpc-protocol-admin-key": "wrong-" + "x" * 16}):
            with pytest.raises(InferenceServerException) as caught:
                call(client, headers)
            assert "PERMISSION_DENIED" in str(caught.value.status()) and DOOR in caught.value.message()
        call(client, door.grpc_headers)  # does not raise
    finally:
        client.close()


@pytest.mark.parametrize("path", [
    "/v2/repository/models/../outside/load", "/v2/repository/models/..%2Foutside/load",
    "/v2/repository/models/%2e%2e/load", "/v2/models/a%2Fb/ready", "/v2/models/" + "x" * 256 + "/ready",
])
def test_names_with_dots_slashes_or_over_255_characters_are_refused_at_the_door(door, path):
    status, answer = rest.request(door.url + path, "POST" if path.endswith("load") else "GET",
                                  b"{}" if path.endswith("load") else None, door.http_headers)
    assert status == 400 and DOOR in json.loads(answer)["error"], (path, answer)


def test_a_255_character_name_passes_the_door_and_triton_answers_it(door):
    status, answer = rest.request(f"{door.url}/v2/models/{'x' * 255}/ready", headers=door.http_headers)
    assert status == 400 and DOOR not in answer.decode(), answer  # Triton's own "unknown model"


def test_the_key_is_on_no_command_line_or_environment_of_the_door(door):
    pids = group_members(door.nginx_pid)
    assert door.nginx_pid in pids and len(pids) >= 2, "found no nginx worker: the check would prove nothing"
    for pid in pids:
        process = psutil.Process(pid)
        assert door.key not in " ".join(process.cmdline())
        assert not any(door.key in value for value in process.environ().values())
    conf = door.access_log.parent / "nginx.conf"
    assert conf.stat().st_mode & 0o077 == 0  # the key's file: its owner's alone
    assert conf.parent.stat().st_mode & 0o066 == 0  # nobody else lists or writes the folder (0711 as root)


def test_tritonserver_lives_where_only_the_door_reaches_it_and_holds_no_key(door):
    """As root, serve moves tritonserver into a network namespace of its own (netns.py): nobody on this
    machine's loopback can connect to its ports, so it needs no key, and none is on any command line."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of its own needs root: without it tritonserver keeps its key")
    assert network_namespace(door.serve.pid) != network_namespace(), "tritonserver shares this machine's loopback"
    assert network_namespace(door.nginx_pid) == network_namespace(door.serve.pid)  # the door connects inside
    # The detector, inside tritonserver's namespace, finds it on both ports (the control); here, on neither.
    probe = f"{REACHES}\nimport sys\nprint([triton_at(int(p)) for p in sys.argv[1:]])"
    ports = [str(p) for p in door.triton_ports]
    inside = subprocess.run(["nsenter", f"--net=/proc/{door.serve.pid}/ns/net", "--", sys.executable, "-c", probe,
                             *ports], capture_output=True, text=True, timeout=60)
    here = subprocess.run([sys.executable, "-c", probe, *ports], capture_output=True, text=True, timeout=60)
    assert (inside.stdout.strip(), here.stdout.strip()) == ("[True, True]", "[False, False]"), (inside, here)
    everyone = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]]
    assert not [p.pid for p in everyone if door.key in " ".join(p.info["cmdline"])], "the key is on a command line"
    triton = psutil.Process(door.serve.pid)
    assert not any(door.key in value for value in triton.environ().values())
    assert rest.request(f"{door.url}/v2/health/ready")[0] == 200  # and the door does reach it
    status, page = rest.request(f"http://{door.serve.metrics}/metrics")
    assert status == 200 and b"nv_inference_request_success" in page  # the metrics page, through the door


#: ``triton_at(port)``: whether tritonserver answers on 127.0.0.1:PORT of the namespace this code runs in, by its
#: HTTP liveness (200, no body) or its gRPC ServerLive. A bare connect cannot tell tritonserver from whatever else
#: of that namespace uses the same port number (a learner's kernel or JupyterLab, another test's server): run 80
#: of make test found a learner's own listener on tritonserver's port number.
REACHES = """
import urllib.request
def triton_at(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=5) as answer:
            if answer.status == 200 and answer.read() == b"":
                return True
    except Exception:
        pass
    try:
        import tritonclient.grpc as grpcclient
        return bool(grpcclient.InferenceServerClient(f"127.0.0.1:{port}").is_server_live(client_timeout=5))
    except Exception:
        return False
"""
#: What an unprivileged local user tries (run as ``nobody`` here, as a learner by tests/class): the crashing POST
#: through the door five times, the server's readiness after each, tritonserver's own ports (:data:`REACHES`),
#: and the key in every command line and readable environment. Prints: the answers, the ports where tritonserver
#: answered, whether ``ps`` showed a tritonserver, how many environments it read, whether the key was found.
AS_UNPRIVILEGED = REACHES + """
import glob, subprocess, sys, urllib.error
door, key, ports = sys.argv[1], sys.stdin.read().strip(), [int(p) for p in sys.argv[2:]]
answers = []
for _ in range(5):
    request = urllib.request.Request(f"http://{door}/v2/health/ready", data=b"a=" + b"x" * (4 << 20),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        answers.append(urllib.request.urlopen(request, timeout=30).status)
    except urllib.error.HTTPError as exc:
        answers.append(exc.code)
    answers.append(urllib.request.urlopen(f"http://{door}/v2/health/ready", timeout=10).status)
reached = [port for port in ports if triton_at(port)]
args = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
environs = 0
found = key in args
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        found = found or key.encode() in open(path, "rb").read()
        environs += 1
    except OSError:
        pass
print(",".join(map(str, answers)), ",".join(map(str, reached)) or "none", "tritonserver" in args, environs, found)
"""
#: What :data:`AS_UNPRIVILEGED` prints first when every POST was refused and the server stayed ready.
REFUSED_AND_READY = ",".join(["415,200"] * 5)


def test_an_unprivileged_local_user_can_neither_crash_reach_nor_read_the_key(door):
    """The issue's unprivileged user, for real: ``nobody``, on this machine, outside any class namespace."""
    if os.geteuid() != 0:
        pytest.skip("running the probe as another user needs root")
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", sys.executable,
                           "-c", AS_UNPRIVILEGED, door.serve.http, *map(str, door.triton_ports)],
                          input=door.key, capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr
    answers, reached, saw_triton, environs, found = done.stdout.split()
    assert answers == REFUSED_AND_READY and reached == "none", done.stdout
    assert saw_triton == "True" and int(environs) > 0, f"the probe saw too little to prove anything: {done.stdout}"
    assert found == "False", "nobody read the admin key from a command line or an environment"
    assert alive(door.serve.pid), "tritonserver died: a POST reached it"


def test_upstream_tritonclient_flows_pass_the_door_with_the_key(door):
    """Statistics, model control and system shared memory, over HTTP and gRPC, as test_serve_admin runs them."""
    _flows(door.serve, door.http_headers, door.grpc_headers)


def test_a_crash_behind_the_door_keeps_its_ports_held_and_tritonserver_comes_back(door):
    """Last in the module: it kills tritonserver. The door's ports stay bound (nobody can take them),
    clients get a 503 that says why, and ``--restart`` brings tritonserver back on its own ports."""
    before = door.serve.pid
    psutil.Process(before).send_signal(signal.SIGKILL)
    assert not port_is_free(int(door.serve.http.rsplit(":", 1)[1]))
    assert not port_is_free(int(door.serve.grpc.rsplit(":", 1)[1]))
    seen: list[tuple[int, bytes]] = []
    grpc_errors: list[InferenceServerException] = []
    channel = grpcclient.InferenceServerClient(door.serve.grpc)

    def ready() -> tuple[int, bytes]:
        seen.append(rest.request(f"{door.url}/v2/health/ready", timeout=5))
        try:
            channel.is_server_ready()
        except InferenceServerException as exc:
            grpc_errors.append(exc)
        return seen[-1]

    assert poll(ready, lambda answer: answer[0] == 200, 90, 0.1)[0] == 200, seen[-1]
    # serve waits a second before it restarts (crash.backoff_delay): the door answered meanwhile, in words
    # a notebook recognizes (notebook.explain_restarts prints one line for them), over HTTP and gRPC.
    down = [body for status, body in seen if status == 503]
    assert down and all(RESTARTING in json.loads(body)["error"] for body in down), seen[:3]
    assert grpc_errors and all(RESTARTING in str(e) and "UNAVAILABLE" in str(e.status()) for e in grpc_errors), \
        grpc_errors[:3]
    err = poll(door.serve.err.read_text, lambda t: "restarted: pid" in t, 30, 0.2)
    after = int(re.search(r"restarted: pid (\d+)", err).group(1))
    assert after != before and f"--http-port={door.triton_ports[0]}" in psutil.Process(after).cmdline()
    door.serve.pid = after
    assert alive(door.nginx_pid)
