"""lab_backends.lessons.management against a real Triton: versions, overrides, unload in flight, the locked API.

One server per module (cost_model from the project repository plus a two-version model in a
scratch repository); the tests run in file order and each leaves the models as it found them.
Everything asserted here is what notebook 07 teaches.
"""

from __future__ import annotations

import base64
import json
import os
import socket

import numpy as np
import pytest

from lab_backends.client.infer import infer
from lab_backends.errors import LabBackendsError
from lab_backends.lessons import authoring, management
from lab_backends.lessons.authoring import Tensor
from lab_backends.server.config_changes import apply_config, derive_config

# --------------------------------------------------------------------------------------------- unit


def test_version_policy_is_exactly_one_of_three():
    assert management.version_policy(latest=2).latest.num_versions == 2
    assert list(management.version_policy(specific=[1, 3]).specific.versions) == [1, 3]
    assert management.version_policy(all=True).WhichOneof("policy_choice") == "all"
    for bad in ({}, {"latest": 1, "all": True}, {"latest": 0}, {"specific": []}):
        with pytest.raises(LabBackendsError):
            management.version_policy(**bad)


def test_load_request_body_follows_the_protocol():
    config = management.versioned_config("v")
    body = json.loads(management.load_request_body(config, {"file:1/model.py": b"print(1)"}))
    assert json.loads(body["parameters"]["config"])["name"] == "v"
    assert base64.b64decode(body["parameters"]["file:1/model.py"]) == b"print(1)"
    assert json.loads(management.load_request_body()) == {}
    with pytest.raises(LabBackendsError, match="together with a config"):
        management.load_request_body(None, {"file:1/model.py": b""})
    with pytest.raises(LabBackendsError, match="file:1/model.py"):
        management.load_request_body(config, {"1/model.py": b""})


# ------------------------------------------------------------------------------------- integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from lab_backends.paths import MODEL_REPOSITORY
    from lab_backends.server.triton_server import TritonServer

    repo = tmp_path_factory.mktemp("management-repo")
    authoring.write_model(repo, management.VERSIONED_SOURCE, management.versioned_config("versioned"), versions=(1, 2))
    with TritonServer(model_repository=[MODEL_REPOSITORY, repo], models=["cost_model", "versioned"]) as server:
        yield server


def test_version_policies(lab):
    server = lab
    assert management.ready_versions(server, "versioned") == [2]  # default: latest 1
    assert management.infer_version(server, "versioned") == 2
    apply_config(server, "versioned", lambda c: c.version_policy.CopyFrom(management.version_policy(all=True)))
    assert management.ready_versions(server, "versioned") == [1, 2]
    assert [management.infer_version(server, "versioned", v, protocol="grpc") for v in (1, 2)] == [1, 2]
    assert management.infer_version(server, "versioned") == 2  # unversioned: the highest ready
    apply_config(server, "versioned", lambda c: c.version_policy.CopyFrom(management.version_policy(specific=[1])))
    assert management.ready_versions(server, "versioned") == [1]
    assert management.infer_version(server, "versioned") == 1
    with pytest.raises(Exception, match="not at ready state"):
        management.infer_version(server, "versioned", 2)
    management.reload_from_disk(server, "versioned")
    assert management.ready_versions(server, "versioned") == [2]


def test_override_replaces_the_whole_config(lab):
    server = lab
    partial = authoring.ModelConfig(name="versioned", backend="python")
    partial.version_policy.CopyFrom(management.version_policy(all=True))
    server.load_model("versioned", config=partial)
    assert len(server.model_config("versioned").input) == 0  # the inputs went with the rest
    with pytest.raises(Exception, match="expected 0 inputs"):
        management.infer_version(server, "versioned")
    server.load_model("versioned")  # unchanged files: a no-op, the override stays (2.51)
    assert len(server.model_config("versioned").input) == 0
    management.reload_from_disk(server, "versioned")
    assert len(server.model_config("versioned").input) == 1

    def edit(config):
        config.max_batch_size = 2

    sent = derive_config(server.model_config("versioned"), edit)
    assert server.model_config("versioned").max_batch_size == 8  # deriving does not load
    apply_config(server, "versioned", edit)
    served = server.model_config("versioned")
    assert served.max_batch_size == 2 and list(served.input) == list(sent.input)
    with pytest.raises(Exception, match="batch-size must be <= 2"):
        infer(server, "versioned", {"X": np.zeros((3, 1), np.float32)})
    management.reload_from_disk(server, "versioned")


def test_request_in_flight_survives_an_unload(lab):
    server = lab
    apply_config(server, "cost_model", lambda c: c.parameters["fixed_ms"].__setattr__("string_value", "1500"))
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    seen = management.unload_during_request(server, "cost_model", {"INPUT0": x}, expected={"OUTPUT0": x})
    assert seen.request_ok and seen.output_matches and not seen.error
    assert seen.unload_call_s < seen.answered_after_unload_s <= seen.gone_after_unload_s
    assert set(seen.states_during.values()) == {"UNLOADING"}
    assert "cost_model" in seen.new_request_error
    assert not server.http_client.is_model_ready("cost_model")
    server.load_model("cost_model")
    assert server.model_config("cost_model").parameters["fixed_ms"].string_value == "10"  # from disk again
    with pytest.raises(LabBackendsError, match="make it slower"):
        management.unload_during_request(server, "cost_model", {"INPUT0": x}, unload_after_s=1.0)
    server.load_model("cost_model")  # the helper refused before unloading, so this is a no-op


WHOAMI = '''
import json, os, socket
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        facts = json.dumps({"uid": os.getuid(), "host": socket.gethostname()}).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("FACTS", np.array([facts], dtype=object))])
                for _ in requests]
'''


def test_repository_api_needs_the_key_and_uploads_run_code(lab):
    server = lab
    config = authoring.python_config("whoami", [Tensor("DUMMY", "INT32", [1])], [Tensor("FACTS", "BYTES", [1])])
    attempt = management.unauthenticated_load(server, "whoami", config, {"file:1/model.py": WHOAMI.encode()})
    assert attempt.status == 403 and "admin-key" in attempt.body
    assert "whoami" not in {e["name"] for e in server.repository_index()}  # nothing was created
    assert management.unauthenticated_load(server, "cost_model").status == 403
    with pytest.raises(Exception, match="restricted"):
        server.grpc_client.load_model("cost_model")
    management.upload_model(server, "whoami", WHOAMI, config)
    facts = json.loads(infer(server, "whoami", {"DUMMY": np.zeros(1, np.int32)}, protocol="http")["FACTS"][0])
    assert facts == {"uid": os.getuid(), "host": socket.gethostname()}
    server.unload_model("whoami")
    management.wait_until_unloaded(server, "whoami")


