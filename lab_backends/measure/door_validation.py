"""What the front door's validating gateway costs: latency at c=1 and throughput at c=16, with and without it.

``python -m lab_backends.measure.door_validation``: one tritonserver serving ``echo`` (16 float32: the
model costs little, so the door's share shows), and before it, in turn, the front door without the
gateway (nginx straight to tritonserver, as before issue 46) and with it (:mod:`door_gateway`). For
each door and protocol (HTTP/JSON over kept-alive connections, gRPC unary): :data:`SERIAL` requests one
at a time (p50, p99), then :data:`THREADS` client threads in a closed loop for :data:`LOAD_S` seconds
(requests a second). Clients, nginx, the gateway and tritonserver share this machine's cores: the
numbers are this machine's, one run; docs/scale.md quotes them. Written to ``bench/door_validation.csv``.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
from tritonclient.grpc import service_pb2, service_pb2_grpc

from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.front_door import DoorAccess, door_for
from lab_backends.server.netns import PublicPorts, take_ports
from lab_backends.server.triton_server import TritonServer

MODEL = "echo"
SERIAL = 400
THREADS = 16
LOAD_S = 8.0
X = np.arange(16, dtype=np.float32)
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": X.tolist()}]}).encode()


def _http_sender(address: str):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)

    def send() -> None:
        connection.request("POST", f"/v2/models/{MODEL}/infer", BODY, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200 or len(answer.read()) == 0:
            raise RuntimeError(f"HTTP {answer.status} from the door during the measurement")
    return send


def _grpc_sender(address: str):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[16])
    request.raw_input_contents.append(X.tobytes())

    def send() -> None:
        stub.ModelInfer(request, timeout=60)
    return send


def measure(address: str, make) -> dict:
    send = make(address)
    for _ in range(20):
        send()  # warm: connections, the gateway's first config read
    times = []
    for _ in range(SERIAL):
        t0 = time.perf_counter()
        send()
        times.append((time.perf_counter() - t0) * 1000)
    stop, counts = threading.Event(), []

    def loop() -> None:
        own, n = make(address), 0
        while not stop.is_set():
            own()
            n += 1
        counts.append(n)

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(loop) for _ in range(THREADS)]
        t0 = time.perf_counter()
        time.sleep(LOAD_S)
        stop.set()
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - t0
    p50, p99 = (round(float(np.percentile(times, q)), 2) for q in (50, 99))
    return {"p50_ms_c1": p50, "p99_ms_c1": p99, "req_per_s_c16": round(sum(counts) / elapsed, 1)}


def main() -> pd.DataFrame:
    rows = []
    with TritonServer(models=[MODEL], target="local") as server, tempfile.TemporaryDirectory() as tmp:
        for validate in (False, True):
            ports = PublicPorts(*take_ports(None, None, None))
            try:
                with door_for(server, ports, DoorAccess(), Path(tmp) / str(validate), validate=validate) as door:
                    s = door.settings
                    for protocol, address, make in (("http", f"{s.host}:{s.http_port}", _http_sender),
                                                    ("grpc", f"{s.host}:{s.grpc_port}", _grpc_sender)):
                        row = {"door": "nginx + gateway" if validate else "nginx only", "protocol": protocol,
                               **measure(address, make)}
                        print(row, flush=True)
                        rows.append(row)
            finally:
                ports.close()
    table = pd.DataFrame(rows)
    table.to_csv(PROJECT_ROOT / "bench" / "door_validation.csv", index=False)
    print(table.to_string(index=False))
    return table


if __name__ == "__main__":
    main()
