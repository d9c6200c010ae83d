"""A model whose Python stub died is reloaded by ``lab-backends serve --restart`` (server/stub_health.py).

Triton 2.51 never restarts a dead stub and keeps the model READY while every request fails with
``Stub process '<instance>' is not healthy`` (pinned by the ``upstream`` test at the end). Under
``serve --restart`` (what a class runs: classroom/supervisor.py) the next request of a learner
succeeds a few seconds later, tritonserver is not restarted and the other models are not touched.

One ``serve --restart`` (``rel_double`` and ``echo``, two Python models) is shared by the first two
tests; the upstream test starts a bare server of its own (one model), since healing must be absent
there. Evidence is deterministic: the stubs' PIDs (psutil, by command line), tritonserver's PID,
``serve``'s own report lines, the answers. The only clock is the deadline for the heal:
:data:`DEADLINE_S`, the 10 s promised for a heal doubled for a machine twice as slow, plus margin.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from types import SimpleNamespace

import pytest

from lab_backends import rest
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import health
from lab_backends.server.triton_server import TritonServer
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS
from tests.reliability.serve_process import Serve

pytestmark = pytest.mark.server

#: What serve --restart promises: a dead stub found and its model serving again within this.
HEAL_S = 10.0
#: How long a test waits for it: a machine twice as slow, plus margin.
DEADLINE_S = 2 * HEAL_S + 10.0
#: serve's line once it has reloaded echo.
RELOADED = "stub health: model 'echo' reloaded"
X = [1.0, 2.0, 3.0]
#: 2**62 + 1 elements of FP32 are 2**64 + 4 bytes: the byte size wraps to the 4 bytes that follow the
#: header, so the server's size check passes and the stub is handed a tensor it cannot build.
WRAPPING_SHAPE = 4611686018427387905


def _stubs(pid: int) -> dict[str, health.Stub]:
    """Live stubs of the tritonserver ``pid`` (its process group), by instance name."""
    return health.stubs(SimpleNamespace(pid=pid, target="local"))


def _infer(http: str, model: str, data: list[float], shape: list[int]) -> tuple[int, str]:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": data}]}).encode()
    try:
        status, answer = rest.request(f"http://{http}/v2/models/{model}/infer", "POST", body,
                                      {"Content-Type": "application/json"}, 15)
    except OSError as exc:
        return 0, str(exc)
    return status, answer.decode(errors="replace")


def _echo(http: str) -> tuple[int, str]:
    return _infer(http, "echo", X, [len(X)])


def _echoes(answer: tuple[int, str]) -> bool:
    return answer[0] == 200 and json.loads(answer[1])["outputs"][0]["data"] == X


def _double_answers(http: str) -> bool:
    status, text = _infer(http, "rel_double", [float(i) for i in range(16)], [1, 16])
    return status == 200 and json.loads(text)["outputs"][0]["data"] == [2.0 * i for i in range(16)]


def _ready(http: str, model: str) -> int:
    return rest.request(f"http://{http}/v2/models/{model}/ready", "GET", None, None, 10)[0]


def _wrapping_binary_request(http: str, model: str) -> tuple[int, str]:
    """The learner's request, byte for byte, on a socket of its own: header shape ``[2**62 + 1]``, 4 bytes of data."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [WRAPPING_SHAPE], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    body = header + b"\x00\x00\x80\x3f"  # one FP32 1.0, little-endian
    host, port = http.rsplit(":", 1)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks).decode(errors="replace")
    return int(answer.split(" ", 2)[1]), answer


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``lab-backends serve --restart`` with two Python models, copied into a repository of its own."""
    tmp = tmp_path_factory.mktemp("stub_health")
    repo = tmp / "repo"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(TEST_MODELS / "rel_double", repo / "rel_double", ignore=skip)
    shutil.copytree(MODEL_REPOSITORY / "echo", repo / "echo", ignore=skip)
    serve = Serve(tmp, "--restart", "--admin-key-file", str(tmp / "admin.key"), "--model-repository", str(repo),
                  "--model", "echo")
    try:
        serve.admin = {"admin-key": (tmp / "admin.key").read_text().strip()}
        yield serve
    finally:
        serve.stop()


def _heals(served: Serve, killed_stub: int, other_stub: int, what: str, said: str) -> float:
    """Wait for echo to answer again; check how it came back; the seconds it took. ``said``: serve's stderr
    before the stub died."""
    started = time.monotonic()
    answer = poll(lambda: _echo(served.http), _echoes, DEADLINE_S, 0.2)
    took = time.monotonic() - started
    # echo answers once Triton has loaded it again; serve reports the reload after its load call returned and
    # it found the new stub (stub_health.py _heal): the line may come a moment later. Wait for it, bounded.
    report = poll(served.err.read_text, lambda t: RELOADED in t[len(said):], DEADLINE_S, 0.1)
    assert _echoes(answer), f"echo did not answer within {DEADLINE_S:.0f} s after {what}: {answer}\n{report}"
    live = _stubs(served.pid)
    assert live["echo_0_0"].pid != killed_stub, "echo answered from the stub that was killed?"
    assert RELOADED in report[len(said):], report
    # tritonserver was not restarted and the other model was not touched.
    assert "restarted: pid" not in report and os.getpgid(live["echo_0_0"].pid) == served.pid, report
    assert live["rel_double_0_0"].pid == other_stub and "'rel_double'" not in report, report
    assert _double_answers(served.http)
    print(f"\n{what}: echo answered again {took:.1f} s later")
    return took


def test_serve_restart_reloads_a_model_whose_stub_was_killed(served):
    before = _stubs(served.pid)
    killed, other = before["echo_0_0"].pid, before["rel_double_0_0"].pid
    said = served.err.read_text()
    os.kill(killed, signal.SIGKILL)
    _heals(served, killed, other, "SIGKILL of echo's stub", said)


@pytest.mark.upstream
def test_the_wrapping_binary_shape_kills_echos_stub_and_serve_heals_it(served):
    before = _stubs(served.pid)
    victim, other = before["echo_0_0"].pid, before["rel_double_0_0"].pid
    said = served.err.read_text()
    status, answer = _wrapping_binary_request(served.http, "echo")
    assert status == 500 and "Stub process 'echo_0_0' is not healthy" in answer, (
        f"UPSTREAM FIXED? the wrapping shape no longer kills echo's stub (HTTP {status}): {answer[-300:]}")
    _heals(served, victim, other, "the wrapping binary shape", said)
    # Everything the serve reported about stubs concerns echo: two deaths, two reloads.
    lines = [ln for ln in served.err.read_text().splitlines() if ln.startswith("stub health:")]
    assert sum("reloaded in" in ln for ln in lines) == 2 and all("'echo'" in ln for ln in lines), lines


def _repository(served: Serve, action: str, model: str, config: dict | None = None) -> None:
    body = json.dumps({"parameters": {"config": json.dumps(config)}} if config else {}).encode()
    status, answer = rest.request(f"http://{served.http}/v2/repository/models/{model}/{action}", "POST", body,
                                  {"Content-Type": "application/json", **served.admin}, 120)
    assert status == 200, f"{action} {model}: HTTP {status} {answer!r}"


def test_model_control_is_not_mistaken_for_a_dead_stub(served):
    """An admin's unload stays unloaded, and a count of 2 going back to 1 keeps ``echo_0_1`` (Triton updates
    instances in place), which a check by instance name once took for a dead ``echo_0_0`` and reloaded."""
    said = served.err.read_text()
    status, config = rest.request(f"http://{served.http}/v2/models/echo/config", "GET", None, served.admin, 10)
    config = json.loads(config)
    for count in (2, 1):
        config["instance_group"][0]["count"] = count
        _repository(served, "load", "echo", config)
    _repository(served, "unload", "rel_double")
    # The unload answers before the instance is finalized (its stub ends ~1 s later: UpdateHealth sleeps 1 s).
    kept = poll(lambda: {name: stub.pid for name, stub in _stubs(served.pid).items()},
                lambda live: "rel_double_0_0" not in live, 20, 0.1)
    assert list(kept) == ["echo_0_1"], kept
    # The watch looks once a second and confirms 0.5 s later: 3 s are two looks on a machine twice as slow.
    time.sleep(3.0)
    assert served.err.read_text() == said, served.err.read_text()[len(said):]
    assert {name: stub.pid for name, stub in _stubs(served.pid).items()} == kept
    assert _ready(served.http, "rel_double") != 200 and _echoes(_echo(served.http))


@pytest.mark.upstream
def test_triton_alone_keeps_a_model_with_a_dead_stub_ready_and_failing():
    """Why stub_health exists: Triton 2.51 itself never relaunches a dead stub (python_backend r24.05 did,
    in the failing request's execute; r24.06 removed it) and never marks the model unready."""
    with TritonServer(MODEL_REPOSITORY, models=["echo"]) as server:
        os.kill(health.stubs(server)["echo_0_0"].pid, signal.SIGKILL)
        assert "echo_0_0" not in poll(lambda: health.stubs(server), lambda live: "echo_0_0" not in live, 10, 0.1)
        for attempt in range(2):  # the first request after the death, and the next
            status, answer = _echo(server.http_url)
            assert status == 500 and "Stub process 'echo_0_0' is not healthy" in answer, (
                f"UPSTREAM FIXED? request {attempt + 1} after the stub's death answered HTTP {status}: {answer}; "
                "if Triton now relaunches stubs, server/stub_health.py can go")
            assert _ready(server.http_url, "echo") == 200, "UPSTREAM FIXED? the model is no longer READY"
            assert "echo_0_0" not in health.stubs(server), "UPSTREAM FIXED? Triton relaunched the stub"
        assert health.check_stubs(server) == {"echo": ["echo_0_0"]}
        health.recover(server, "echo", notify=None)  # the one cure (and no exit timeout waited out at stop)
        assert _echoes(_echo(server.http_url))
