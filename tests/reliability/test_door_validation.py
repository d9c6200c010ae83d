"""The front door's validating gateway on a real tritonserver: Triton 2.51's crashers are refused with 4xx
(HTTP) or INVALID_ARGUMENT / RESOURCE_EXHAUSTED (gRPC), tritonserver and its stubs live on, and the
lessons' requests are still answered, HTTP and gRPC, unary and streamed.

One ``serve --front-door --restart`` for the module (~10 s to start) on a copy of ``rel_double``,
``echo`` and ``stream_topk``; the tests together take ~15 s more. A refusal is told apart from
Triton's own answer by the door's wording, and "tritonserver lived" by its PID and serve's stderr
(no "restarted"), and each stub by a correct answer afterwards (a dead stub answers 500 for good).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from lab_backends import rest
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.door_rules import DOOR
from lab_backends.server.processes import alive
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS
from tests.reliability.serve_process import Serve, copy_models, require_nginx
from tests.reliability.test_crashes import HUGE_SHAPE, NESTED, binary_overflow_request

pytestmark = pytest.mark.server
MODELS = {"rel_double": TEST_MODELS, "echo": MODEL_REPOSITORY, "stream_topk": MODEL_REPOSITORY}


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    require_nginx()
    tmp = tmp_path_factory.mktemp("validation")
    copy_models(MODELS, tmp / "repo")
    serve = Serve(tmp, "--front-door", "--open-admin-apis", "--restart", "--model-repository", str(tmp / "repo"),
                  *[flag for name in MODELS if name != "rel_double" for flag in ("--model", name)])
    try:
        assert "validation: door_gateway (pid" in serve.text, serve.text
        yield serve
    finally:
        serve.stop()
    assert serve.proc.returncode == 0


def _lived(door: Serve, pid: int) -> None:
    """tritonserver is the one that started (no crash, no restart) and every stub still answers right."""
    assert door.pid == pid and alive(pid), "tritonserver died behind the door"
    assert "restarted" not in door.err.read_text(), door.err.read_text()[-500:]
    client = httpclient.InferenceServerClient(door.http)
    try:
        x = np.arange(16, dtype=np.float32)
        for model, shape, want in (("rel_double", (1, 16), 2 * x), ("echo", (16,), x)):
            tensor = httpclient.InferInput("INPUT0", list(shape), "FP32")
            tensor.set_data_from_numpy(x.reshape(shape))
            np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0").reshape(-1), want)
    finally:
        client.close()


def _post(door: Serve, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    status, answer = rest.request(f"http://{door.http}{path}", "POST", body, headers, timeout=60)
    return status, json.loads(answer).get("error", "")


def test_the_http_crashers_are_refused_and_tritonserver_and_its_stubs_live_on(door):
    pid = door.pid
    overflow, binary_headers = binary_overflow_request([4611686018427387905])
    crashers = [
        ("/v2/models/echo/infer", NESTED, {"Content-Type": "application/json"}, 400, "nested"),
        ("/v2/models/echo/infer", NESTED, {"Content-Type": "text/plain"}, 400, "nested"),
        ("/v2/models/echo/generate", NESTED, {"Content-Type": "text/plain"}, 400, "nested"),
        ("/v2/logging", NESTED, {"Content-Type": "application/json"}, 400, "nested"),
        ("/v2/models/echo/infer", gzip.compress(NESTED), {"Content-Encoding": "gzip"}, 400, "nested"),
        ("/v2/models/rel_double/infer", HUGE_SHAPE, {"Content-Type": "application/json"}, 400, "shape"),
        ("/v2/models/echo/infer", HUGE_SHAPE, {"Content-Type": "application/json"}, 413, "elements"),
        ("/v2/models/echo/infer", overflow, binary_headers, 413, "4,611,686,018,427,387,905 elements"),
        ("/v2/models/echo/versions/1/infer", overflow, binary_headers, 413, "4,611,686,018,427,387,905 elements"),
        ("/v2/models/rel_double/infer", overflow, binary_headers, 400, "[1..8, 16]"),
    ]
    for path, body, headers, status, words in crashers:
        answer = _post(door, path, body, headers)
        assert answer[0] == status and answer[1].startswith(DOOR) and words in answer[1], (path, answer)
    _lived(door, pid)


def test_lesson_requests_pass_json_binary_and_compressed(door):
    """Lesson 01's fast-mode large tensor (1 << 16 float32 to echo) binary, 1 << 14 as JSON (1 << 16 written
    out passes the door's 1 MiB body limit), each plain, gzip and deflate; and rel_double at batch 8."""
    client = httpclient.InferenceServerClient(door.http)
    try:
        for binary, size in ((True, 1 << 16), (False, 1 << 14)):
            big = np.random.default_rng(0).standard_normal(size).astype(np.float32)
            for compression in (None, "gzip", "deflate"):
                tensor = httpclient.InferInput("INPUT0", [big.size], "FP32")
                tensor.set_data_from_numpy(big, binary_data=binary)
                out = client.infer("echo", [tensor], request_compression_algorithm=compression)
                np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), big)
        batch = np.ones((8, 16), np.float32)
        tensor = httpclient.InferInput("INPUT0", [8, 16], "FP32")
        tensor.set_data_from_numpy(batch)
        np.testing.assert_array_equal(client.infer("rel_double", [tensor]).as_numpy("OUTPUT0"), 2 * batch)
        tensor = httpclient.InferInput("INPUT0", [9, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((9, 16), np.float32))
        with pytest.raises(Exception, match="1..8, 16"):
            client.infer("rel_double", [tensor])
    finally:
        client.close()


def _raw_request(shape: list[int], data: bytes, model: str = "echo") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    request.raw_input_contents.append(data)
    return request


def test_grpc_unary_crashers_are_refused_and_lessons_pass(door):
    pid = door.pid
    with grpc.insecure_channel(door.grpc, options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        nope = _raw_request([4611686018427387905], b"\0" * 4, "nope")  # no config: checked against its data
        for request, code in ((_raw_request([4611686018427387905], b"\0" * 4), grpc.StatusCode.RESOURCE_EXHAUSTED),
                              (nope, grpc.StatusCode.INVALID_ARGUMENT),
                              (_raw_request([1 << 40], b"\0" * 4), grpc.StatusCode.RESOURCE_EXHAUSTED),
                              (_raw_request([1, 16], b"\0" * 64), grpc.StatusCode.INVALID_ARGUMENT),
                              (_raw_request([(3 << 20) // 8], b"\0" * ((3 << 20) // 2)),
                               grpc.StatusCode.RESOURCE_EXHAUSTED)):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request, timeout=60)
            assert caught.value.code() == code and DOOR in caught.value.details(), caught.value
        x = np.arange(16, dtype=np.float32)
        answer = stub.ModelInfer(_raw_request([16], x.tobytes()), timeout=60)
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), x)
    client = grpcclient.InferenceServerClient(door.grpc)
    try:  # tritonclient's own path, typed errors included
        tensor = grpcclient.InferInput("INPUT0", [2, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 16), np.float32))
        np.testing.assert_array_equal(client.infer("rel_double", [tensor]).as_numpy("OUTPUT0"), np.full((2, 16), 2))
    finally:
        client.close()
    _lived(door, pid)


def _stream(door: Serve, requests: list[service_pb2.ModelInferRequest]) -> tuple[list, grpc.RpcError | None]:
    with grpc.insecure_channel(door.grpc, options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = []
        try:
            for response in stub.ModelStreamInfer(iter(requests), timeout=120):
                answers.append(response)
        except grpc.RpcError as exc:
            return answers, exc
        return answers, None


def test_grpc_streams_pass_lessons_and_end_at_a_bad_message_or_past_their_total(door):
    pid = door.pid
    # stream_topk (lesson 08, decoupled) answers each request with k responses.
    logits = service_pb2.ModelInferRequest(model_name="stream_topk", id="a")
    logits.inputs.add(name="LOGITS", datatype="FP32", shape=[10])
    logits.raw_input_contents.append(np.arange(10, dtype=np.float32).tobytes())
    answers, error = _stream(door, [logits])
    assert error is None and len(answers) >= 3 and not any(a.error_message for a in answers), (error, answers)
    # A good message, then a crasher: the first is answered, then the stream ends with the refusal.
    x = np.arange(16, dtype=np.float32).tobytes()
    answers, error = _stream(door, [_raw_request([16], x), _raw_request([1, 4611686018427387905], b"\0" * 4)])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT and DOOR in error.details()
    # Past a stream's total (64 messages of the largest size): RESOURCE_EXHAUSTED, and a new stream goes on.
    chunk = np.zeros((900 << 10) // 4, np.float32).tobytes()
    answers, error = _stream(door, [_raw_request([len(chunk) // 4], chunk)] * 80)
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "open a new stream" in error.details() and len(answers) <= (64 << 20) // len(chunk), len(answers)
    answers, error = _stream(door, [_raw_request([16], x)])
    assert error is None and np.frombuffer(answers[0].infer_response.raw_output_contents[0], np.float32)[3] == 3
    _lived(door, pid)


def test_a_huge_stream_message_is_refused_before_tritonserver_holds_it(door):
    """A stream has no body limit at nginx (it counts the messages as one body): the gateway bounds each
    message, so the 256 MiB message that took tritonserver to 3.39 GB never reaches it (4 MiB here)."""
    chunk = np.zeros(1 << 20, np.float32).tobytes()
    answers, error = _stream(door, [_raw_request([1 << 20], chunk)])
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not answers, error


#: What an unprivileged local user (``nobody``: any learner, any web page's POST) sends: the three HTTP crashers.
#: Prints each answer's status.
AS_NOBODY = """
import json, sys, urllib.error, urllib.request
door = sys.argv[1]
header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4611686018427387905], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 4}}]}).encode()
sends = [(b'{"inputs":' + b"[" * 200_000, {"Content-Type": "text/plain"}),
         (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1099511627776], "datatype": "FP32", "data": [1.0]}]})
          .encode(), {"Content-Type": "application/json"}),
         (header + bytes(4), {"Inference-Header-Content-Length": str(len(header))})]
answers = []
for body, headers in sends:
    try:
        answers.append(urllib.request.urlopen(urllib.request.Request(f"http://{door}/v2/models/echo/infer", body,
                                                                     headers), timeout=60).status)
    except urllib.error.HTTPError as exc:
        answers.append(exc.code)
print(",".join(map(str, answers)))
"""


def test_an_unprivileged_local_user_cannot_crash_tritonserver_through_the_door(door):
    """The crashers from another user's process (``nobody``), as a learner of a class would send them (~1 s)."""
    if os.geteuid() != 0:
        pytest.skip("running the probe as another user needs root")
    pid = door.pid
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", sys.executable,
                           "-c", AS_NOBODY, door.http], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["400,413,413"], done.stdout
    _lived(door, pid)


def test_a_killed_gateway_is_started_again_on_its_ports_and_the_door_answers(door):
    """``--restart`` keeps the gateway too (server/gateway_watch.py): killed, it is started again within a few
    seconds, on the ports nginx's upstreams name, and HTTP and gRPC inference pass the door again; tritonserver
    was never touched."""
    pid = door.pid
    old = int(re.search(r"validation: door_gateway \(pid (\d+)\)", door.text).group(1))
    log = re.search(r"its log (\S+gateway\.log)", door.text).group(1)
    first = json.loads((Path(log).parent / "gateway.ready").read_text())
    os.kill(old, signal.SIGKILL)
    err = poll(door.err.read_text, lambda t: "gateway is back" in t, 60, 0.2)
    back = re.search(r"the front door's gateway is back: pid (\d+), ports (\d+) \(HTTP\) and (\d+) \(gRPC\)", err)
    assert back and int(back.group(1)) != old and alive(int(back.group(1))), err[-800:]
    assert (int(back.group(2)), int(back.group(3))) == (first["http_port"], first["grpc_port"])
    assert "the front door's gateway exited (-9)" in err, err[-800:]
    x = np.arange(16, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": x.tolist()}]})
    status, answer = rest.request(f"http://{door.http}/v2/models/echo/infer", "POST", body.encode(), timeout=30)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == x.tolist(), (status, answer)
    with grpc.insecure_channel(door.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        raw = stub.ModelInfer(_raw_request([16], x.tobytes()), timeout=30).raw_output_contents[0]
    assert np.frombuffer(raw, np.float32).tolist() == x.tolist()
    _lived(door, pid)


def test_after_a_crash_the_gateway_reaches_the_restarted_tritonserver(door):
    """Last in the module: it kills tritonserver. Once ``--restart`` brings it back (ready at the door), the
    first HTTP inference through the gateway is answered (a kept-alive connection to the dead server is not
    reused for a 503), and gRPC inference passes within 30 s (the gateway's channel retries within a second)."""
    before = door.pid
    psutil.Process(before).send_signal(signal.SIGKILL)
    err = poll(door.err.read_text, lambda t: "restarted: pid" in t, 90, 0.2)
    door.pid = int(re.search(r"restarted: pid (\d+)", err).group(1))
    assert door.pid != before
    x = np.arange(16, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": x.tolist()}]})

    def http_answer() -> tuple[int, bytes]:
        return rest.request(f"http://{door.http}/v2/models/echo/infer", "POST", body.encode(), timeout=10)

    ready = poll(lambda: rest.request(f"http://{door.http}/v2/health/ready", timeout=10)[0], lambda c: c == 200, 90)
    assert ready == 200
    seen = http_answer()
    assert seen[0] == 200 and json.loads(seen[1])["outputs"][0]["data"] == x.tolist(), seen

    def grpc_answer() -> grpc.RpcError | bytes:
        try:
            with grpc.insecure_channel(door.grpc) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                return stub.ModelInfer(_raw_request([16], x.tobytes()), timeout=10).raw_output_contents[0]
        except grpc.RpcError as exc:
            return exc

    answer = poll(grpc_answer, lambda a: isinstance(a, bytes), 30, 0.2)
    assert isinstance(answer, bytes) and np.frombuffer(answer, np.float32).tolist() == x.tolist(), answer
