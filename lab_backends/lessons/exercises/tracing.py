"""Notebook 02's exercise: find the request that queued longest in a trace."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lab_backends.client.infer import make_inputs
from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.measure import trace
from lab_backends.server.running import RunningServer
from lab_backends.server.triton_server import TritonServer


@exercise(
    "longest_queue",
    notebook="02_tracing_the_request_path",
    task=(
        "Write longest_queue(log) that takes a lab_backends.measure.trace.TraceLog and returns the request_id "
        "of the top-level request that spent the longest time in the scheduler queue. The checker "
        "sends a burst of requests to cost_model on a traced server and compares your answer with "
        "the trace's QUEUE_START/COMPUTE_START stamps."
    ),
    models=("cost_model",),
    traced=True,
)
def _check_longest_queue(answer: Callable[[Any], str], server: RunningServer | None) -> str:
    with contextlib.ExitStack() as stack:
        if server is None or server.trace_file is None or server.target != "local":
            # A server of our own, traced: the checker must read the trace file it writes.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="exercise-trace-"))
            server = stack.enter_context(TritonServer(
                models=["cost_model"], target="local", trace_file=Path(tmp) / "trace.json", trace_log_frequency=1))
        tag = uuid.uuid4().hex[:6]
        x = np.ones((1, 16), np.float32)
        server.grpc_client.infer("cost_model", make_inputs({"INPUT0": x}), request_id=f"warmup-{tag}")
        ids = trace.send_burst(server, "cost_model", {"INPUT0": x}, 6, prefix=f"burst-{tag}")
        # Without log_frequency (and with no trace_count or settings update, as here) the file
        # appears only at shutdown (server src/tracer.cc:1242-1248 at r24.10): stop first, then read.
        if server.options.trace_log_frequency == 0:
            server.stop()
        log = trace.read_trace(server.trace_file, request_ids=ids).select(ids)
    top = log.requests[log.requests["depth"] == 0]
    expected = top.loc[top["queue_ms"].idxmax()]
    got = answer(log)
    if got != expected["request_id"]:
        mine = top.loc[top["request_id"] == got, "queue_ms"]
        detail = f" ({float(mine.iloc[0]):.2f} ms)" if not mine.empty else " (not one of the burst's request ids)"
        raise ExerciseError(
            f"you returned {got!r}{detail}, but {expected['request_id']!r} queued longest "
            f"({expected['queue_ms']:.2f} ms). Queue time is COMPUTE_START - QUEUE_START of top-level requests."
        )
    return f"{got!r} waited {expected['queue_ms']:.1f} ms in the queue, the longest of the burst."
