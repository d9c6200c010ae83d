"""One bad request gets its own error; the good requests batched with it get their right answers.

Measured before the fix: the sklearn backend raised for the whole batch, so 0-16 of 24 good
requests sent together with one NaN request failed with "Input X contains NaN".
"""

from __future__ import annotations

import pickle
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer, make_inputs
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server

BATCHED = {  # model -> (input, output compared, feature count)
    "digits_logreg": ("PIXELS", "PROBABILITIES", 64),
    "digits_onnx": ("PIXELS", "LOGITS", 64),
    "digits_postprocess": ("LOGITS", "PROBS", 10),
}
N = 24
POISONED = 7


@pytest.fixture(scope="module")
def server():
    from lab_backends.digits import install_python_backends

    install_python_backends()  # the sklearn backend's model.py as this checkout has it
    with TritonServer(models=[*BATCHED, "running_mean", "stream_topk"], startup_timeout_s=180) as srv:
        yield srv


def _batch_counts(server: TritonServer, model: str) -> tuple[int, int]:
    stats = server.statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


@pytest.mark.parametrize("model", sorted(BATCHED))
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_poisoned_request_fails_alone(server, model, poison):
    name, output, width = BATCHED[model]
    rng = np.random.default_rng(0)
    rows = [rng.uniform(-1, 1, (1, width)).astype(np.float32) for _ in range(N)]
    reference = [infer(server, model, {name: r})[output] for r in rows]  # one at a time
    bad = rows[POISONED].copy()
    bad[0, 3] = poison
    sent = [bad if i == POISONED else r for i, r in enumerate(rows)]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    batched = False
    try:
        for _ in range(3):  # until the server really batched the poisoned request with others
            before = _batch_counts(server, model)
            answers: queue.Queue = queue.Queue()
            for i, x in enumerate(sent):
                client.async_infer(
                    model, make_inputs({name: x}), lambda result, error, i=i: answers.put((i, result, error))
                )
            got = dict((i, (r, e)) for i, r, e in (answers.get(timeout=30) for _ in range(N)))
            for i, (result, error) in got.items():
                if i == POISONED:
                    assert result is None and "NaN or infinity" in error.message(), error
                else:
                    assert error is None, f"good request {i} failed beside the poisoned one: {error}"
                    np.testing.assert_allclose(result.as_numpy(output), reference[i], rtol=1e-5, atol=1e-6)
            after = _batch_counts(server, model)
            if after[1] - before[1] < after[0] - before[0]:  # fewer executions than requests
                batched = True
                break
    finally:
        client.close()
    assert batched, "the requests were never batched together: the test proved nothing"


def test_sklearn_answers_match_the_estimator(server):
    """The answers kept for good rows are the estimator's own, not merely self-consistent."""
    estimator = pickle.loads((MODEL_REPOSITORY / "digits_logreg" / "1" / "model.pkl").read_bytes())
    x = np.random.default_rng(1).uniform(-1, 1, (5, 64)).astype(np.float32)
    got = infer(server, "digits_logreg", {"PIXELS": x})["PROBABILITIES"]
    np.testing.assert_allclose(got, estimator.predict_proba(x), rtol=1e-4, atol=1e-6)


def test_running_mean_refuses_nan_and_keeps_its_state(server):
    def step(value, start=False, end=False):
        return infer(
            server,
            "running_mean",
            {"VALUE": np.array([[value]], dtype=np.float32)},
            sequence_id=4242,
            sequence_start=start,
            sequence_end=end,
        )

    step(2.0, start=True)
    with pytest.raises(InferenceServerException, match="finite"):
        step(np.nan)
    out = step(4.0, end=True)
    assert float(out["MEAN"].reshape(-1)[0]) == 3.0 and int(out["COUNT"].reshape(-1)[0]) == 2


def _first_step(server: TritonServer, k: int) -> tuple[grpcclient.InferenceServerClient, float]:
    """Open a stream, ask for ``k`` steps, wait for the first; returns the client and the wait in s."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    logits = np.arange(10, dtype=np.float32)
    started = time.monotonic()
    client.async_stream_infer("stream_topk", make_inputs({"LOGITS": logits, "K": np.array([k], dtype=np.int32)}))
    result, error = got.get(timeout=30)
    assert error is None, f"{error.status()} {error.message()} {error.debug_details()}"
    return client, time.monotonic() - started


def test_stream_topk_stops_a_cancelled_stream(server):
    """A cancelled stream stops computing: the next stream (one instance) starts at once.

    Statistics count the cancelled stream's request either way, so the instance's availability is
    the observable: had the cancelled stream kept computing, the next one would wait for its 9 steps.
    """
    config = server.model_config("stream_topk")
    config.parameters["step_delay_ms"].string_value = "400"
    server.load_model("stream_topk", config=config)
    full_s = 9 * 0.4  # ten steps, nine delays
    try:
        first, _ = _first_step(server, 10)
        first.stop_stream(cancel_requests=True)
        first.close()
        second, waited_s = _first_step(server, 1)
        second.stop_stream()
        second.close()
        assert waited_s < full_s / 2, f"the next stream waited {waited_s:.1f} s: the cancelled one kept running"
    finally:
        server.unload_model("stream_topk")
        server.load_model("stream_topk")
