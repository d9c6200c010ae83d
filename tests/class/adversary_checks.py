"""The class adversary (issue 46): a curious learner throws at the class's front door what a learner can.

The body of one test of ``test_class_hub.py``. As learner A, in A's namespaces with A's environment (so A's
token, as their kernels send it): Triton 2.51's crashers of docs/reliability.md (nested JSON as
``application/json`` and ``text/plain``, the JSON shape ``[1099511627776]``, the 4 MiB form-encoded POST, the
64-bit-wrapping binary shape to ``echo``), a 256 MiB gRPC stream message (sent as HTTP/2 DATA frames of 16 KiB
by hand: the message is never held whole, by A or by tritonclient), IDs in learner B's range (inject, START,
END; HTTP, gRPC unary and a stream) while B's own sequence runs, and tokenless requests. Each is refused or
bounded; meanwhile learner C sends real requests in a bounded loop and gets >= 99% answered; afterwards
tritonserver is the same process, every Python stub of it too (a dead stub leaves its model READY: a new stub
PID or a missing one is how a death shows), every model READY, and B's running mean holds B's values only.
"""

from __future__ import annotations

import json
import pwd
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import psutil
from sandbox_checks import _SEQUENCE
from sandbox_probes import as_learner, learner_command

from lab_backends import rest
from lab_backends.learner import SEQUENCE_SPAN

#: As A: every attack, each outcome printed as one JSON object. argv: door HTTP, door gRPC, B's UID.
_ATTACK = r"""
import json, select, socket, struct, sys, time, urllib.error, urllib.request
import grpc, numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from lab_backends import learner
http, grpc_door, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
mine = learner.headers()
assert mine, "not in a learner's environment"
out = {}

def post(path, body, headers, token=True):
    request = urllib.request.Request(f"http://{http}{path}", body, {**headers, **(mine if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return [answer.status, ""]
    except urllib.error.HTTPError as exc:
        return [exc.code, json.loads(exc.read() or b"{}").get("error", "")]

nested = b'{"inputs":' + b"[" * 200_000
huge = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1099511627776], "datatype": "FP32", "data": [1.0]}]})
header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4611686018427387905], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 4}}]}).encode()
out["crashers"] = {
    "nested json": post("/v2/models/echo/infer", nested, {"Content-Type": "application/json"}),
    "nested text/plain": post("/v2/models/echo/infer", nested, {"Content-Type": "text/plain"}),
    "huge json shape": post("/v2/models/echo/infer", huge.encode(), {"Content-Type": "application/json"}),
    "4 MiB form": post("/v2/models/echo/infer", b"a=" + b"x" * (4 << 20),
                       {"Content-Type": "application/x-www-form-urlencoded"}),
    "wrapping binary shape": post("/v2/models/echo/infer", header + bytes(4),
                                  {"Inference-Header-Content-Length": str(len(header))}),
}

def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

def literal(name, value):  # HPACK: a literal header field without indexing, plain strings (each < 127 bytes)
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()

def varint(n):
    bits = b""
    while n > 0x7F:
        bits, n = bits + bytes([n & 0x7F | 0x80]), n >> 7
    return bits + bytes([n])

def huge_stream_message(size):
    # One ModelStreamInfer message of `size` raw bytes, by hand over HTTP/2: 16 KiB DATA frames as the flow-control
    # windows allow, the peer's frames read in between; stops when the door ends the stream.
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[size // 4])
    head = request.SerializeToString() + b"\x3a" + varint(size)  # field 7 (raw_input_contents), its length
    host, port = grpc_door.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
              (":authority", grpc_door), ("content-type", "application/grpc"), ("te", "trailers"), *mine.items()]
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) +
                 frame(1, 4, 1, b"".join(literal(k, v) for k, v in fields)))
    pending, left, zeros = b"\x00" + struct.pack(">I", len(head) + size) + head, size, bytes(16384)
    windows, initial, buf, ended, sent = [65535, 65535], 65535, b"", None, 0
    started = time.monotonic()
    while ended is None and time.monotonic() - started < 120:
        can_send = (pending or left) and min(windows) > 0
        if select.select([sock], [], [], 0 if can_send else 30)[0]:
            data = sock.recv(1 << 16)
            if not data:
                ended = "closed"
            buf += data
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                stream, payload, buf = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + length], buf[9 + length:]
                if kind == 4 and not flags & 1:
                    for i in range(0, len(payload), 6):
                        key, value = struct.unpack(">HI", payload[i:i + 6])
                        if key == 4:
                            windows[1], initial = windows[1] + value - initial, value
                    sock.sendall(frame(4, 1, 0))
                elif kind == 8:
                    windows[0 if stream == 0 else 1] += struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                elif kind == 6 and not flags & 1:
                    sock.sendall(frame(6, 1, 0, payload))
                elif kind in (0, 1) and stream == 1 and flags & 1:
                    ended = "ended by the door"
                elif kind == 3 and stream == 1 or kind == 7:
                    ended = "reset by the door"
        elif can_send:
            piece = pending[:min(windows + [16384])] if pending else zeros[:min(windows + [16384, left])]
            if pending:
                pending = pending[len(piece):]
            else:
                left -= len(piece)
            sock.sendall(frame(0, 0 if (pending or left) else 1, 1, piece))
            windows = [w - len(piece) for w in windows]
            sent += len(piece)
    sock.close()
    return {"sent": sent, "size": size, "ended": ended, "seconds": round(time.monotonic() - started, 2)}

out["stream message"] = huge_stream_message(256 << 20)

theirs = victim * learner.SEQUENCE_SPAN + 7
def value(v):
    return json.dumps({"parameters": {"sequence_id": theirs, **v},
                       "inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [1, 1], "data": [1000.0]}]})
flags = {"inject": {}, "START": {"sequence_start": True}, "END": {"sequence_end": True}}
json_type = {"Content-Type": "application/json"}
mean_url = "/v2/models/running_mean/infer"
out["http sequences"] = {k: post(mean_url, value(f).encode(), json_type) for k, f in flags.items()}
client = grpcclient.InferenceServerClient(grpc_door)
tensor = grpcclient.InferInput("VALUE", [1, 1], "FP32")
tensor.set_data_from_numpy(np.array([[1000.0]], np.float32))
out["grpc sequences"] = {}
for k, f in flags.items():
    try:
        client.infer("running_mean", [tensor], sequence_id=theirs, sequence_start="START" in k, sequence_end="END" in k,
                     headers=mine, client_timeout=60)
        out["grpc sequences"][k] = ["answered", ""]
    except InferenceServerException as exc:
        out["grpc sequences"][k] = [exc.status(), exc.message()]
answers = []
client.start_stream(lambda result, error: answers.append(error.message() if error else "answered"), headers=mine)
client.async_stream_infer("running_mean", [tensor], sequence_id=theirs, sequence_start=True)
waited = time.monotonic()
while not answers and time.monotonic() - waited < 60:
    time.sleep(0.05)
client.stop_stream()
client.close()
out["grpc stream sequence"] = answers[:1]
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
out["tokenless"] = {"http infer": post("/v2/models/echo/infer", body, {"Content-Type": "application/json"}, False),
                    "http metadata": post("/v2/models/echo", None, {}, False)}
with grpc.insecure_channel(grpc_door) as channel:
    try:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            service_pb2.ModelMetadataRequest(name="echo"), timeout=60)
        out["tokenless"]["grpc metadata"] = ["answered", ""]
    except grpc.RpcError as exc:
        out["tokenless"]["grpc metadata"] = [str(exc.code()), exc.details()]
print(json.dumps(out))
"""
#: As C: echo inferences through the door (the learner's token) for argv[1] seconds, 20 a second, bounded.
_WORK = """
import json, os, sys, time
from lab_backends import rest
url = os.environ["TRITON_URL"] + "/v2/models/echo/infer"
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).encode()
sent, failed, end = 0, [], time.monotonic() + float(sys.argv[1])
while time.monotonic() < end and sent < 2000:
    try:
        status = rest.request(url, "POST", body, {"Content-Type": "application/json"}, timeout=10)[0]
    except OSError as exc:
        status = repr(exc)
    sent += 1
    failed += [] if status == 200 else [str(status)]
    time.sleep(0.05)
print(json.dumps({"sent": sent, "failed": failed}))
"""


def _stubs(triton: int) -> set[int]:
    return {p.pid for p in psutil.Process(triton).children(recursive=True) if "triton_python_backend_stub" in p.name()}


def adversary(room: Any, servers: dict[str, int], shared_triton: Callable[[Any], int | None]) -> None:
    a, b, c = list(room.learners)
    http, grpc_port = room.triton_http, room.settings()["triton_ports"][1]
    triton = shared_triton(room)
    assert triton, "the shared tritonserver was not found"
    stubs, rss = _stubs(triton), psutil.Process(triton).memory_info().rss
    assert stubs, "no Python stub of the shared tritonserver was found"
    bobs = subprocess.Popen(**learner_command(b, servers[b], _SEQUENCE, "2.0", "4.0"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = ""
        while bobs.poll() is None and not line.startswith("mean "):
            line = bobs.stdout.readline()
        assert line.split() == ["mean", "2.0", "1"], (line, bobs.stderr.read() if bobs.poll() is not None else "")
        with ThreadPoolExecutor(1) as pool:
            working = pool.submit(as_learner, c, servers[c], _WORK, "25")
            attack = as_learner(a, servers[a], _ATTACK, http, f"127.0.0.1:{grpc_port}",
                                str(pwd.getpwnam(b).pw_uid), timeout_s=240)
            work = json.loads(working.result(timeout=240).stdout)
        end, err = bobs.communicate("\n", timeout=60)
    finally:
        if bobs.poll() is None:
            bobs.kill()
    seen = json.loads(attack.stdout)
    for name, (status, error) in seen["crashers"].items():
        assert status in (400, 413, 415) and "front door" in error, f"{name}: {status} {error}"
    stream = seen["stream message"]
    assert stream["ended"] in ("ended by the door", "reset by the door") and stream["seconds"] < 120, stream
    own = f"{pwd.getpwnam(a).pw_uid * SEQUENCE_SPAN + 1}..{(pwd.getpwnam(a).pw_uid + 1) * SEQUENCE_SPAN - 1}"
    for how, (status, error) in seen["http sequences"].items():
        assert status == 403 and own in error and "map your IDs into it" in error, f"HTTP {how}: {status} {error}"
    for how, (status, error) in seen["grpc sequences"].items():
        assert status == "StatusCode.PERMISSION_DENIED" and own in error, f"gRPC {how}: {status} {error}"
    assert len(seen["grpc stream sequence"]) == 1 and own in seen["grpc stream sequence"][0], seen
    for how, (status, error) in seen["tokenless"].items():
        assert status in (401, "StatusCode.UNAUTHENTICATED") and "learner token" in error, f"{how}: {status} {error}"
    assert "mean 3.0 2" in end.splitlines(), f"B's sequence saw A's values: {end} {err[-500:]}"
    assert work["sent"] >= 100 and len(work["failed"]) <= work["sent"] // 100, f"C while A attacked: {work}"
    assert shared_triton(room) == triton, "tritonserver was restarted: an attack reached it"
    assert _stubs(triton) == stubs, "a Python stub of the shared tritonserver died or was replaced"
    grown = psutil.Process(triton).memory_info().rss - rss
    assert grown < 128 << 20, f"tritonserver grew {grown >> 20} MiB: the 256 MiB message reached it"
    for model in room.settings()["models"]:
        assert rest.request(f"http://{http}/v2/models/{model}/ready", timeout=10)[0] == 200, f"{model} not ready"
    print(f"adversary: C sent {work['sent']}, {len(work['failed'])} failed; the stream message {stream}; "
          f"tritonserver grew {grown >> 20} MiB")
