"""The same request as REST+JSON, REST+binary and gRPC, timed side by side (notebook 01).

Built on the hand-made exchanges of :mod:`lab_backends.client.protocol`.
"""

from __future__ import annotations

import http.client
import statistics
import time
from typing import Any, Mapping

import grpc
import numpy as np
import pandas as pd
from tritonclient.grpc import service_pb2_grpc

from lab_backends import learner
from lab_backends.client.protocol import grpc_request, request_body, timed_post
from lab_backends.server.running import RunningServer


def compare_latency(server: RunningServer, model: str, inputs: Mapping[str, np.ndarray], repeats: int = 20,
                    warmup: int = 2) -> "Any":
    """Median/p90 latency of the same request as REST+JSON, REST+binary and gRPC (sequential, bounded).

    Each variant encodes its request once and reuses one connection, so that neither Python-side
    encoding nor connection setup is measured; the time runs from sending the request to having
    read the whole response. Returns a pandas
    DataFrame with one row per variant: request bytes, response bytes, p50 and p90 in ms.
    """
    if repeats < 1 or repeats > 10_000:
        raise ValueError(f"repeats must be between 1 and 10000, not {repeats}")
    rows = []
    host, _, port = server.http_url.rpartition(":")
    path = f"/v2/models/{model}/infer"
    for label, binary in (("REST, JSON tensors", False), ("REST, binary tensors", True)):
        # Encode once: we time the protocol round trip, not numpy-to-JSON in this notebook's Python.
        body, headers = request_body(inputs, binary=binary)
        headers = {**headers, "Content-Length": str(len(body))}
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            times, size = [], 0
            for i in range(warmup + repeats):
                _, payload, elapsed = timed_post(conn, path, body, headers)
                size = len(payload)
                if i >= warmup:
                    times.append(elapsed)
        finally:
            conn.close()
        rows.append((label, len(body), size, times))
    request = grpc_request(model, inputs)
    limit = 1 << 30
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", limit),
                                                        ("grpc.max_receive_message_length", limit)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            response = stub.ModelInfer(request, timeout=120, metadata=learner.metadata())
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1000)
    rows.append(("gRPC (protobuf, raw bytes)", request.ByteSize(), response.ByteSize(), times))
    return pd.DataFrame(
        [
            {
                "variant": label,
                "request_bytes": req,
                "response_bytes": resp,
                "p50_ms": statistics.median(t),
                "p90_ms": float(np.percentile(t, 90)),
                "requests": len(t),
            }
            for label, req, resp, t in rows
        ]
    ).set_index("variant")
