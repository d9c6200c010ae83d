"""What the framework backends' tests (test_native_frameworks.py: lab_tensorflow, lab_libtorch;
test_executorch_backend.py: lab_executorch) read from a server the same way: the held-out digits and
a model's logits for them, a model's statistics counted to a known total, requests sent all at once,
an unload waited for.
"""

from __future__ import annotations

import threading

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends.client.infer import infer
from lab_backends.digits.data import load_split, normalize
from lab_backends.measure.stats import batch_rows
from lab_backends.waiting import poll


def held_out_pixels() -> np.ndarray:
    """The 360 held-out digits, normalized as every digits model takes them."""
    return normalize(load_split().test_images)


def served_logits(server, model: str, pixels: np.ndarray) -> np.ndarray:
    """``model``'s logits for every row of ``pixels``, as served (requests of 64 rows)."""
    return np.concatenate([infer(server, model, {"PIXELS": pixels[i:i + 64]})["LOGITS"]
                           for i in range(0, len(pixels), 64)])


def model_stats(server, model: str) -> dict:
    return server.statistics(model)["model_stats"][0]


def counts(statistics: dict) -> tuple[int, int, int]:
    """(successes, failures, executions) of one model's statistics."""
    inference = statistics["inference_stats"]
    return (int(inference["success"]["count"]), int(inference["fail"]["count"]),
            int(statistics["execution_count"]))


def counted(server, model: str, before: dict, requests: int, rows: int, timeout_s: float = 30.0) -> dict:
    """The statistics once they count ``requests`` more requests (answered or failed) and ``rows`` more
    answered rows than ``before``: a known total, not a quiet period. Per-request statistics come
    before the batch's record (the backends' report()): ``inference_count`` grows with each success,
    by its rows (core src/infer_stats.cc L104-L111 at r24.10), ``execution_count`` and ``batch_stats``
    with the batch record (L386-L425), whose sizes add up to the same rows: both are waited for.
    Past the deadline the last read is returned and the caller's assertions say what is missing."""
    def complete(now: dict) -> bool:
        answered = sum(counts(now)[:2]) - sum(counts(before)[:2])
        return (answered >= requests and int(now["inference_count"]) - int(before["inference_count"]) >= rows
                and batch_rows(now) - batch_rows(before) >= rows)

    return poll(lambda: model_stats(server, model), complete, timeout_s, 0.05)


def concurrently(server, model: str, requests: list[np.ndarray]) -> list[object]:
    """Send every request at once (one gRPC client per thread); each answer's LOGITS or its exception."""
    results: list[object] = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def send(i: int) -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            barrier.wait(timeout=30)
            try:
                results[i] = infer(server, model, {"PIXELS": requests[i]}, client=client)["LOGITS"]
            except InferenceServerException as exc:
                results[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def unloaded(server, name: str, timeout_s: float = 60.0) -> None:
    """An unload returns before the model is gone (Triton finishes it in the background): wait for it."""
    def state() -> str:
        return next((m.get("state", "") for m in server.repository_index() if m["name"] == name), "")
    poll(state, lambda s: s != "READY", timeout_s, 0.05)
