"""Notebook 01's exercise: a KServe v2 JSON request body written by hand."""

from __future__ import annotations

import json
from typing import Callable

import numpy as np

from lab_backends import rest
from lab_backends.errors import ExerciseError
from lab_backends.lessons.exercises.registry import exercise
from lab_backends.server.running import RunningServer


def _post_json(server: RunningServer | None, model: str, body: bytes) -> tuple[int, bytes]:
    return rest.request(
        f"http://{server.http_url}/v2/models/{model}/infer", "POST", body,
        {"Content-Type": "application/json"}, timeout=30,
    )


@exercise(
    "kserve_json_body",
    notebook="01_rest_and_grpc",
    task=(
        "Write request_body(x) that returns the KServe v2 JSON request body (a dict) for cost_model: "
        "x is a float32 array of shape [batch, 16] for input INPUT0; ask for output OUTPUT0 as JSON "
        "(no binary extension). The checker POSTs json.dumps(request_body(x)) to "
        "/v2/models/cost_model/infer for batches of 1 and 3 and expects the tensor back."
    ),
    models=("cost_model",),
)
def _check_kserve_json_body(answer: Callable[[np.ndarray], dict], server: RunningServer | None) -> str:
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        body = answer(x)
        if not isinstance(body, dict):
            raise ExerciseError(f"request_body must return a dict (the JSON object), not {type(body).__name__}")
        if any("parameters" in i and "binary_data_size" in i.get("parameters", {}) for i in body.get("inputs", [])):
            raise ExerciseError("this exercise is about plain JSON: put the numbers in 'data', no binary_data_size")
        try:
            encoded = json.dumps(body).encode()
        except TypeError as exc:
            raise ExerciseError(f"the body is not JSON-serialisable ({exc}); use x.flatten().tolist()") from exc
        status, payload = _post_json(server, "cost_model", encoded)
        if status != 200:
            raise ExerciseError(
                f"Triton answered HTTP {status} for a batch of {batch}: {payload.decode(errors='replace')}"
            )
        try:
            reply = json.loads(payload)
        except ValueError as exc:  # UnicodeDecodeError too: raw bytes after a JSON header
            raise ExerciseError(
                "the answer is not plain JSON: OUTPUT0 came back binary (a JSON header, then raw bytes); ask for "
                "it without 'binary_data' (or leave 'outputs' out) so it comes back as JSON"
            ) from exc
        outputs = {o["name"]: o for o in reply.get("outputs", [])}
        if "OUTPUT0" not in outputs:
            raise ExerciseError(f"the response has no OUTPUT0 (outputs: {list(outputs)}); did you ask for it?")
        out = outputs["OUTPUT0"]
        if "data" not in out:
            raise ExerciseError("OUTPUT0 came back binary; ask for it without 'binary_data' so it is JSON")
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        if got.shape != x.shape or not np.allclose(got, x):
            raise ExerciseError(
                f"cost_model echoed a tensor of shape {got.shape} that differs from x {x.shape}: check "
                "'shape' (it includes the batch dimension) and that 'data' is x flattened row by row"
            )
    return "Triton accepted your hand-written JSON for batches of 1 and 3 and echoed the exact tensor."
