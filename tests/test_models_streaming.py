"""Streaming (decoupled ``stream_topk``) and state (sequence-batched ``running_mean``), served for real.

Both models are light (numpy only), so this module's server starts in seconds.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer, make_inputs
from lab_backends.digits.reference import softmax
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

#: Between stream_topk's steps: 0.1 s here, 5x the committed step_delay_ms. A spread check below needs the
#: responses to reach the client apart, and a client that stalls (a busy CI machine) takes in together what came
#: meanwhile: of 3 gaps (0.3 s) the checks need 1, so only a stall over 0.2 s can fail them (at 20 ms: 40 ms).
STEP_DELAY_S = 0.1
LOGITS = np.array([0.3, 2.0, -1.0, 0.0, 4.0, 1.5, 0.1, 3.0, -2.0, 0.5], dtype=np.float32)


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=["stream_topk", "running_mean"], startup_timeout_s=180) as srv:
        config = srv.model_config("stream_topk")
        config.parameters["step_delay_ms"].string_value = f"{STEP_DELAY_S * 1000:g}"
        srv.load_model("stream_topk", config=config)
        yield srv


def _expected_topk(logits: np.ndarray, k: int):
    probs = softmax(logits.reshape(1, -1).astype(np.float64))[0]
    order = np.argsort(-probs, kind="stable")[:k]
    return [str(d) for d in order], probs[order]


# ---------------------------------------------------------------- streaming
def _grpc_stream(server, logits, k=None, timeout_s=30.0):
    """Send one request on a gRPC stream; return [(seconds since send, result or error)] up to the final flag."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((time.monotonic(), result, error)))
    inputs = {"LOGITS": logits} if k is None else {"LOGITS": logits, "K": np.array([k], np.int32)}
    received = []
    try:
        start = time.monotonic()
        client.async_stream_infer("stream_topk", make_inputs(inputs), request_id="s1",
                                  enable_empty_final_response=True)
        deadline = start + timeout_s
        while time.monotonic() < deadline:
            at, result, error = events.get(timeout=max(0.01, deadline - time.monotonic()))
            received.append((at - start, result, error))
            if error is not None:
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        else:
            pytest.fail(f"no final response within {timeout_s} s")
    finally:
        client.stop_stream()
        client.close()
    return received


def test_grpc_stream_sends_one_response_per_step(server):
    received = _grpc_stream(server, LOGITS, k=4)
    data = [(t, r) for t, r, e in received if r.as_numpy("LABEL") is not None]
    assert all(e is None for _, _, e in received)
    assert len(data) == 4 and len(received) == 5  # four steps, then the empty final response
    labels, probs = _expected_topk(LOGITS, 4)
    assert [r.as_numpy("LABEL")[0].decode() for _, r in data] == labels
    np.testing.assert_allclose([r.as_numpy("PROB")[0] for _, r in data], probs, rtol=1e-6)
    assert [int(r.as_numpy("STEP")[0]) for _, r in data] == [0, 1, 2, 3]
    # Streamed, not sent together at the end: the model sleeps 3 step delays between the first
    # and the last send; at least one of them must separate the arrivals even on a busy machine.
    spread = data[-1][0] - data[0][0]
    assert spread >= STEP_DELAY_S, f"responses arrived within {spread:.3f} s"


def test_grpc_stream_default_k_and_error(server):
    received = _grpc_stream(server, LOGITS)
    assert len([r for _, r, _ in received if r.as_numpy("LABEL") is not None]) == 3  # default_k
    received = _grpc_stream(server, LOGITS, k=11)
    errors = [e for _, _, e in received if e is not None]
    assert errors and "K must be between 1 and 10, got 11" in str(errors[0])
    assert len(_grpc_stream(server, LOGITS, k=1)) == 2  # the model still streams after an error


def _sse(server, body: dict, timeout_s: float = 30.0):
    """POST generate_stream; return (status, [(seconds, event dict)])."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/stream_topk/generate_stream",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST",
    )
    events = []
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = response.status
            assert response.headers["Content-Type"].startswith("text/event-stream")
            for raw in response:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append((time.monotonic() - start, json.loads(line[5:])))
    except urllib.error.HTTPError as exc:
        # Failed before the first response: one JSON error (sometimes framed as an SSE event).
        body = exc.read().decode().strip()
        return exc.code, [(0.0, json.loads(body[5:] if body.startswith("data:") else body))]
    return status, events


def test_http_generate_stream(server):
    status, events = _sse(server, {"LOGITS": LOGITS.tolist(), "K": 4})
    assert status == 200
    labels, probs = _expected_topk(LOGITS, 4)
    assert [e["LABEL"] for _, e in events] == labels
    np.testing.assert_allclose([e["PROB"] for _, e in events], probs, rtol=1e-6)
    assert [e["STEP"] for _, e in events] == [0, 1, 2, 3]
    assert events[-1][0] - events[0][0] >= STEP_DELAY_S  # streamed as sent, not buffered


def test_http_generate_stream_error_and_plain_infer_refused(server):
    status, events = _sse(server, {"LOGITS": LOGITS.tolist(), "K": 0})
    assert any("K must be between 1 and 10, got 0" in e.get("error", "") for _, e in events), (status, events)
    status, events = _sse(server, {"LOGITS": LOGITS.tolist()[:3]})  # wrong shape: refused up front
    assert status == 400 and "error" in events[0][1]
    with pytest.raises(InferenceServerException, match="(?i)decoupled"):
        infer(server, "stream_topk", {"LOGITS": LOGITS}, protocol="http")
    assert _sse(server, {"LOGITS": LOGITS.tolist(), "K": 2})[0] == 200


# ---------------------------------------------------------------- sequences
def _step(server, corrid, value, start, end, client=None, protocol="grpc"):
    out = infer(
        server, "running_mean", {"VALUE": np.array([[value]], np.float32)}, protocol=protocol, client=client,
        sequence_id=corrid, sequence_start=start, sequence_end=end,
        **({"client_timeout": 30} if protocol == "grpc" else {}),
    )
    return float(out["MEAN"][0, 0]), int(out["COUNT"][0, 0])


def _sequence_values(corrid: int, length: int) -> list[float]:
    return [float(corrid % 97 + 3 * i) for i in range(length)]


def test_interleaved_sequences_keep_their_own_state(server):
    """Four sequences advanced in turn from one client: only possible with several in flight."""
    corrids, length = [101, 202, 303, 404], 5
    values = {c: _sequence_values(c, length) for c in corrids}
    for i in range(length):
        for n, c in enumerate(corrids):
            protocol = "http" if n % 2 else "grpc"
            mean, count = _step(server, c, values[c][i], i == 0, i == length - 1, protocol=protocol)
            assert count == i + 1
            assert mean == pytest.approx(np.mean(values[c][: i + 1]), rel=1e-6)


def test_concurrent_sequences_are_batched_without_cross_talk(server):
    corrids, length = list(range(1001, 1013)), 12

    def run(corrid):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            got = [_step(server, corrid, v, i == 0, i == length - 1, client=client)
                   for i, v in enumerate(_sequence_values(corrid, length))]
        finally:
            client.close()
        return corrid, got

    with ThreadPoolExecutor(len(corrids)) as pool:
        results = list(pool.map(run, corrids))
    for corrid, got in results:
        values = _sequence_values(corrid, length)
        assert [c for _, c in got] == list(range(1, length + 1))
        np.testing.assert_allclose([m for m, _ in got], np.cumsum(values) / np.arange(1, length + 1), rtol=1e-6)
    stats = server.statistics("running_mean")["model_stats"][0]
    sizes = [int(b["batch_size"]) for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"sequences never shared a batch: {sizes}"


def test_start_resets_state_and_sequence_errors_are_clear(server):
    assert _step(server, 77, 10.0, True, True) == (10.0, 1)
    assert _step(server, 77, 4.0, True, False) == (4.0, 1)  # a new sequence with the same id: fresh
    assert _step(server, 77, 6.0, False, True) == (5.0, 2)
    with pytest.raises(InferenceServerException, match="(?i)correlation ID"):
        infer(server, "running_mean", {"VALUE": np.array([[1.0]], np.float32)})
    with pytest.raises(InferenceServerException, match="(?i)data-type"):
        infer(server, "running_mean", {"VALUE": np.array([[1]], np.int32)}, sequence_id=78, sequence_start=True)
    assert _step(server, 79, 2.0, True, True) == (2.0, 1)
