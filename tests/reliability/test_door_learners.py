"""A class's front door on a real tritonserver (issue 46): each learner's sequences are their own, and a request
without a learner's token is refused, over HTTP and gRPC, unary and streamed.

One ``serve --front-door`` with a learners' secret (as a class runs it; ~10 s to start) on ``echo`` and
``running_mean``; the tests take ~3 s more. The learners are two accounts of this machine, ``daemon`` (UID 1)
and ``nobody`` (UID 65534): the gateway reads their UIDs from the system, as it does a class's learners'.
Evidence that a refused request did not touch a sequence: ``running_mean``'s own COUNT and MEAN afterwards.
"""

from __future__ import annotations

import json
import queue
import secrets

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from lab_backends import learner, rest
from lab_backends.learner import SEQUENCE_SPAN
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.door_share import NO_TOKEN
from tests.reliability.conftest import TEST_MODELS
from tests.reliability.serve_process import Serve, copy_models, require_nginx

pytestmark = pytest.mark.server
MODELS = {"rel_double": TEST_MODELS, "echo": MODEL_REPOSITORY, "running_mean": MODEL_REPOSITORY}
ADA, BOB = "daemon", "nobody"
UID = {ADA: 1, BOB: 65534}
KEY = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    require_nginx()
    tmp = tmp_path_factory.mktemp("learners")
    copy_models(MODELS, tmp / "repo")
    secret = tmp / "secret"
    secret.write_text(learner.new_secret())
    secret.chmod(0o600)
    serve = Serve(tmp, "--front-door", "--learner-secret-file", str(secret), "--model-repository", str(tmp / "repo"),
                  *[flag for name in MODELS if name != "rel_double" for flag in ("--model", name)],
                  env={"TRITON_ADMIN_KEY": KEY})
    serve.secret = secret.read_text()
    try:
        yield serve
    finally:
        serve.stop()


def _headers(door: Serve, name: str) -> dict[str, str]:
    return {learner.LEARNER_HEADER: name, learner.TOKEN_HEADER: learner.token_for(door.secret, name)}


def _mean(door: Serve, name: str, corrid, value: float, start=False, end=False, extra=None) -> tuple[int, dict]:
    """One ``running_mean`` step over HTTP as ``name`` (or tokenless: ``None``): status and answer (or error)."""
    body = json.dumps({"parameters": {"sequence_id": corrid, "sequence_start": start, "sequence_end": end},
                       "inputs": [{"name": "VALUE", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})
    headers = {"Content-Type": "application/json", **(_headers(door, name) if name else {}), **(extra or {})}
    status, answer = rest.request(f"http://{door.http}/v2/models/running_mean/infer", "POST", body.encode(), headers,
                                  timeout=30)
    found = json.loads(answer)
    outputs = {o["name"]: o["data"][0] for o in found.get("outputs", [])}
    return status, outputs or {"error": found.get("error", "")}


def _grpc_step(door: Serve, name: str, corrid, value: float, start=False, end=False):
    client = grpcclient.InferenceServerClient(door.grpc)
    tensor = grpcclient.InferInput("VALUE", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    try:
        return client.infer("running_mean", [tensor], sequence_id=corrid, sequence_start=start, sequence_end=end,
                            headers=_headers(door, name), client_timeout=30)
    finally:
        client.close()


def test_another_learners_sequence_is_refused_and_left_untouched(door):
    """ada injects into, restarts and ends bob's sequence, over HTTP, gRPC and a gRPC stream, also with a forged
    verified-learner header: each is refused with ada's own range; bob's running mean counts only bob's values."""
    bobs, adas = UID[BOB] * SEQUENCE_SPAN + 7, UID[ADA] * SEQUENCE_SPAN + 7
    assert _mean(door, BOB, bobs, 100.0, start=True) == (200, {"MEAN": 100.0, "COUNT": 1})
    assert _mean(door, ADA, adas, 5.0, start=True) == (200, {"MEAN": 5.0, "COUNT": 1})  # the control: ada's own
    own_range = f"{UID[ADA] * SEQUENCE_SPAN + 1}..{(UID[ADA] + 1) * SEQUENCE_SPAN - 1}"
    forged = {"lab-door-learner": BOB, "Lab-Door-Learner": BOB}  # only nginx says who a request is from
    for start, end, extra in ((False, False, None), (True, False, None), (False, True, None), (False, False, forged)):
        status, answer = _mean(door, ADA, bobs, 1000.0, start, end, extra)
        assert status == 403 and own_range in answer["error"] and "map your IDs into it" in answer["error"], answer
        with pytest.raises(InferenceServerException) as refused:
            _grpc_step(door, ADA, bobs, 1000.0, start, end)
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED" and own_range in refused.value.message()
    # A stream: the refusal ends it, with the same words.
    client, answers = grpcclient.InferenceServerClient(door.grpc), queue.Queue()
    try:
        client.start_stream(lambda result, error: answers.put(error or result), headers=_headers(door, ADA))
        tensor = grpcclient.InferInput("VALUE", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1000.0]], np.float32))
        client.async_stream_infer("running_mean", [tensor], sequence_id=bobs, sequence_start=True)
        error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(error, InferenceServerException) and own_range in error.message(), error
    status, answer = _mean(door, ADA, "abc", 1.0, start=True)  # another's string ID: must carry ada's name
    assert status == 403 and f"'{ADA}:'" in answer["error"], answer
    assert _mean(door, BOB, bobs, 200.0, end=True) == (200, {"MEAN": 150.0, "COUNT": 2})  # only bob's two values
    assert _mean(door, ADA, adas, 15.0, end=True) == (200, {"MEAN": 10.0, "COUNT": 2})


def test_a_request_without_a_token_is_refused_but_readiness_and_the_admin_key_pass(door):
    """Tokenless (or with a bad token): HTTP 401 / gRPC UNAUTHENTICATED with how a learner's requests carry their
    token; readiness checks and the admin key (the supervisor's, the instructor's) are answered."""
    base = f"http://{door.http}"
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
    wrong = {learner.LEARNER_HEADER: ADA, learner.TOKEN_HEADER: learner.token_for(door.secret, BOB)}
    for headers in ({}, wrong, {"lab-door-learner": ADA}):
        status, answer = rest.request(f"{base}/v2/models/echo/infer", "POST", body, headers, timeout=30)
        assert status == 401 and json.loads(answer)["error"] == NO_TOKEN, (headers, status, answer)
        assert rest.request(f"{base}/v2/models/echo", headers=headers, timeout=30)[0] == 401
    assert rest.request(f"{base}/v2/models/echo/infer", "POST", body, _headers(door, ADA), timeout=30)[0] == 200
    for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/echo/ready", "/v2/models/echo/versions/1/ready"):
        assert rest.request(base + path, timeout=30)[0] == 200, path
    assert rest.request(f"{base}/v2/models/echo/stats", headers={"admin-key": KEY}, timeout=30)[0] == 200
    assert rest.request(f"{base}/v2/models/echo/infer", "POST", body, {"admin-key": KEY}, timeout=30)[0] == 200
    with grpc.insecure_channel(door.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="echo"), timeout=30).ready
        for call, request in ((stub.ModelInfer, service_pb2.ModelInferRequest(model_name="echo")),
                              (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="echo"))):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and refused.value.details() == NO_TOKEN
        assert stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="echo"), timeout=30,
                                  metadata=tuple(_headers(door, BOB).items())).name == "echo"
