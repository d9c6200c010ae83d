"""Replay recorded request streams of several learners at once against one server.

The check of :mod:`lab_backends.measure.class_plan`: N simulated learners send, each on its own
gRPC connection, the requests a notebook sent (``bench/scale/footprint.json``), at the recorded
pace, all starting together; the latency of every request is measured at the client. The same
streams go through the simulator, and docs/scale.md compares the two.

Sending is open loop (``async_infer``: a learner does not wait for one answer before the next
request is due), as the simulator assumes. Bounded: at most ``max_requests`` per learner and
``deadline_s`` for the answers.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Iterable, Sequence

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import triton_to_np_dtype

from lab_backends.errors import LabBackendsError
from lab_backends.server.triton_server import TritonServer

INTERVAL_S = 0.5


def example_inputs(server: Any, model: str, length: int = 16) -> list:
    """One request's inputs for ``model``, shaped from its config (-1 dims become ``length``)."""
    config = server.model_config(model)
    tensors = []
    for spec in config.input:
        dims = [length if d < 0 else int(d) for d in spec.dims]
        if config.max_batch_size > 0:
            dims = [1, *dims]
        triton_type = _triton_type(spec.data_type)
        tensor = grpcclient.InferInput(spec.name, dims, triton_type)
        tensor.set_data_from_numpy(np.ones(dims, triton_to_np_dtype(triton_type)))
        tensors.append(tensor)
    return tensors


def _triton_type(data_type: int) -> str:
    return model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_").replace("STRING", "BYTES")


def _learner(url: str, stream: Sequence[tuple[float, str, int]], inputs: dict[str, list], t0: float,
             max_requests: int, out: list[tuple[str, float, float]], errors: list[str], pending: list[int]) -> None:
    client = grpcclient.InferenceServerClient(url)
    lock = threading.Lock()
    sent = 0
    try:
        for t, model, count in stream:
            for k in range(count):
                if sent >= max_requests:
                    return
                due = t0 + t - INTERVAL_S + (k + 0.5) * INTERVAL_S / count
                time.sleep(max(0.0, due - time.monotonic()))
                start = time.monotonic()

                def done(result: Any, error: Any, start: float = start, model: str = model) -> None:
                    with lock:
                        if error is not None:
                            errors.append(str(error)[:200])
                        else:
                            out.append((model, time.monotonic() - start, start - t0))
                        pending[0] -= 1

                with lock:
                    pending[0] += 1
                client.async_infer(model, inputs[model], done)
                sent += 1
    finally:
        deadline = time.monotonic() + 60
        while pending[0] > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.close()


def replay(server: Any, streams: Iterable[Sequence[tuple[float, str, int]]], max_requests: int = 5000,
           deadline_s: float = 300.0, t0: float | None = None) -> tuple[list[tuple[str, float, float]], list[str]]:
    """Send every learner's stream at once; returns ((model, latency s, sent at s) per answer, errors).

    ``sent at`` is when the request really left (a busy client falls behind the recorded pace), so
    the simulator can be given the arrivals the server actually saw. ``t0``: when the streams start
    (``time.monotonic()``, one clock for every process of the machine: learners replayed by separate
    processes start together); half a second from now by default.
    """
    streams = [list(s) for s in streams]
    models = sorted({m for s in streams for _, m, _ in s})
    if not models:
        raise LabBackendsError("nothing to replay: the streams hold no requests")
    inputs = {m: example_inputs(server, m) for m in models}
    latencies: list[tuple[str, float, float]] = []
    errors: list[str] = []
    t0 = time.monotonic() + 0.5 if t0 is None else t0
    threads = []
    for stream in streams:
        pending = [0]
        thread = threading.Thread(target=_learner, daemon=True,
                                  args=(server.grpc_url, stream, inputs, t0, max_requests, latencies, errors, pending))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=max(0.0, t0 + deadline_s - time.monotonic()))
    return latencies, errors


def main(argv: Sequence[str] = sys.argv[1:]) -> int:
    """``python -m lab_backends.measure.replay STREAM.json T0``: one learner's stream against ``TRITON_URL``'s
    server (the remote target), starting at monotonic time ``T0``; the answers as JSON on stdout. What
    ``class measure --sandboxed`` runs inside each simulated learner's sandbox."""
    stream = [tuple(row) for row in json.loads(open(argv[0], encoding="utf-8").read())]
    server = TritonServer(target="remote").start()
    latencies, errors = replay(server, [stream], t0=float(argv[1]))
    print(json.dumps({"latencies": latencies, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
