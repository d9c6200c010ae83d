"""lab_backends.client.streaming and lab_backends.client.sequences against a real server (stream_topk, running_mean)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from lab_backends.client import sequences, streaming
from lab_backends.digits.reference import softmax
from lab_backends.errors import SequenceError, StreamingError
from lab_backends.measure.concurrent_sequences import drive_concurrent
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

LOGITS = np.array([0.3, 2.0, -1.0, 0.0, 4.0, 1.5, 0.1, 3.0, -2.0, 0.5], dtype=np.float32)


#: Between stream_topk's steps: 100 ms here, not the committed 20. A spread check below needs the responses to
#: reach the client apart, and a client that stalls (a busy CI machine) takes in together what came meanwhile:
#: of 3 gaps (300 ms) the check needs 1, so only a stall over 200 ms can fail it (at 20 ms, one over 40 ms could).
STEP_DELAY_MS = 100


@pytest.fixture(scope="module")
def server():
    with TritonServer(models=["stream_topk", "running_mean"], startup_timeout_s=180) as srv:
        config = srv.model_config("stream_topk")
        config.parameters["step_delay_ms"].string_value = str(STEP_DELAY_MS)
        srv.load_model("stream_topk", config=config)
        yield srv


def _expected(k: int) -> tuple[list[str], np.ndarray]:
    probs = softmax(LOGITS.reshape(1, -1).astype(np.float64))[0]
    order = np.argsort(-probs, kind="stable")[:k]
    return [str(d) for d in order], probs[order]


def test_grpc_and_sse_deliver_the_same_sequence(server) -> None:
    grpc_events = streaming.grpc_stream(server, "stream_topk", {"LOGITS": LOGITS, "K": np.array([4], np.int32)})
    status, sse_events = streaming.sse_stream(server, "stream_topk", {"LOGITS": LOGITS.tolist(), "K": 4})
    assert status == 200
    labels, probs = _expected(4)
    for events in (grpc_events, sse_events):
        data = streaming.data_events(events)
        assert [d["LABEL"] for d in data] == labels
        np.testing.assert_allclose([d["PROB"] for d in data], probs, rtol=1e-6)
        assert [d["STEP"] for d in data] == [0, 1, 2, 3]
        assert events[-1].final and not any(e.final for e in events[:-1])
        assert events[-1].t_s - events[0].t_s > STEP_DELAY_MS / 1000  # streamed: 3 gaps of a step, not one reply
    assert len(grpc_events) == 5 and not grpc_events[-1].has_data  # gRPC: an empty final response
    assert streaming.same_sequence(grpc_events, sse_events)
    # ... and the comparison can fail: one probability changed, or a response missing.
    altered = [dataclasses.replace(e, outputs=dict(e.outputs)) for e in sse_events]
    altered[1].outputs["PROB"] *= 1.01
    assert not streaming.same_sequence(grpc_events, altered)
    assert not streaming.same_sequence(grpc_events, sse_events[:-1])
    assert list(streaming.as_frame(sse_events).columns[:4]) == ["t_ms", "LABEL", "PROB", "STEP"]


def test_errors_arrive_as_events_and_timeouts_are_clear(server) -> None:
    events = streaming.grpc_stream(server, "stream_topk", {"LOGITS": LOGITS, "K": np.array([11], np.int32)})
    assert events[-1].final and "K must be between 1 and 10, got 11" in events[-1].error
    status, events = streaming.sse_stream(server, "stream_topk", {"LOGITS": LOGITS.tolist(), "K": 0})
    assert "K must be between 1 and 10, got 0" in events[0].error
    status, events = streaming.sse_stream(server, "stream_topk", {"LOGITS": LOGITS.tolist()[:3]})
    assert status == 400 and events[0].error
    with pytest.raises(StreamingError, match="no final one within"):
        streaming.grpc_stream(server, "stream_topk", {"LOGITS": LOGITS, "K": np.array([10], np.int32)}, timeout_s=0.05)


def test_interleaved_sequences_keep_their_own_means(server) -> None:
    frame = sequences.drive_interleaved(server, {11: [1, 2, 3, 4], 22: [10, 20, 30], 33: [5, 5, 5, 5, 100]})
    assert len(frame) == 12
    np.testing.assert_allclose(frame["mean"], frame["expected"], rtol=1e-6)
    assert frame.groupby("corrid")["count"].max().to_dict() == {11: 4, 22: 3, 33: 5}
    assert list(frame["corrid"][:6]) == [11, 22, 33, 11, 22, 33]  # advanced in turn
    assert not any(sequences.is_live(server, c) for c in (11, 22, 33))
    sequences.step(server, 44, 1.0, start=True)
    assert sequences.is_live(server, 44)  # ... and the probe ended it
    assert not sequences.is_live(server, 44)


def test_concurrent_sequences_share_batches(server) -> None:
    run = drive_concurrent(server, {c: [float(c * i) for i in range(8)] for c in range(101, 109)})
    assert run.correct and len(run.requests) == 64
    assert run.server.requests == 64 and run.server.executions < 64
    assert max(run.server.batch_hist) > 1


def test_bad_sequences_are_refused_clearly(server) -> None:
    with pytest.raises(SequenceError, match="no sequences"):
        sequences.drive_interleaved(server, {})
    with pytest.raises(SequenceError, match="positive integers"):
        sequences.drive_interleaved(server, {0: [1.0]})
    with pytest.raises(SequenceError, match="no values"):
        sequences.drive_interleaved(server, {5: []})




NEVER_FINAL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled, and never closes its requests: one response, no FINAL flag (a learner's mistake)."""

    def execute(self, requests):
        for request in requests:
            out = pb_utils.Tensor("OUT", np.array([1], np.int32))
            request.get_response_sender().send(pb_utils.InferenceResponse([out]))
        return None
'''


def test_a_stream_that_never_ends_times_out_instead_of_hanging(tmp_path) -> None:
    """Past its deadline grpc_stream cancels the request: tritonclient's stop_stream() without
    cancel_requests waits for every request on the stream to end, which this model never does."""
    model = tmp_path / "repo" / "never_final"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(NEVER_FINAL)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    raised: list[BaseException] = []

    def call(server) -> None:
        try:
            streaming.grpc_stream(server, "never_final", {"IN": np.array([1], np.int32)}, timeout_s=0.5)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            raised.append(exc)

    with TritonServer(tmp_path / "repo", target="local", startup_timeout_s=180) as server:
        caller = threading.Thread(target=call, args=(server,), daemon=True)
        caller.start()
        caller.join(30)
        assert not caller.is_alive(), "grpc_stream still waiting 30 s after its 0.5 s deadline"
    assert raised and isinstance(raised[0], StreamingError) and "1 response(s) but no final one" in str(raised[0])
