"""Model management against a running server: versions, config overrides, unloading, uploads.

Notebook 07 drives Triton's model-repository API (``--model-control-mode=explicit``, which every
``TritonServer`` here uses). The helpers below keep its cells short and say *why* each step is
done the way it is:

* a config override on load **replaces the whole config**, so
  :func:`~lab_backends.server.config_changes.derive_config` starts from
  the config the server uses now and changes one field;
* version states come from the repository index, the one API that also lists versions which are
  not loaded (with the reason);
* the model-repository API is restricted by a key; :func:`unauthenticated_load` shows what a
  caller without it gets (403), and :func:`upload_model` what a caller *with* it can do: upload
  ``model.py`` files that the server runs (code execution as the server's user).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from base64 import b64encode
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2

from lab_backends import rest
from lab_backends.client.infer import infer
from lab_backends.errors import LabBackendsError, ModelLoadError
from lab_backends.lessons.authoring import Tensor, python_config
from lab_backends.server.repository import ModelConfig, config_json
from lab_backends.server.running import RunningServer
from lab_backends.waiting import poll

#: A Python model whose every version answers with its own version number: which version served a
#: request is then visible in the response, not only in the server's bookkeeping.
VERSIONED_SOURCE = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers VERSION = the version folder this copy was loaded from."""

    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            version = np.full((x.shape[0], 1), self.version, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("VERSION", version)]))
        return responses
'''


def versioned_config(name: str, versions_policy: model_config_pb2.ModelVersionPolicy | None = None) -> ModelConfig:
    """The config of :data:`VERSIONED_SOURCE`: X FP32 [1] -> VERSION INT32 [1], batching up to 8."""
    config = python_config(name, [Tensor("X", "FP32", [1])], [Tensor("VERSION", "INT32", [1])], max_batch_size=8)
    if versions_policy is not None:
        config.version_policy.CopyFrom(versions_policy)
    return config


def version_policy(
    latest: int | None = None, specific: Sequence[int] | None = None, all: bool = False
) -> model_config_pb2.ModelVersionPolicy:
    """One of Triton's three version policies: ``latest=N``, ``specific=[...]`` or ``all=True``."""
    chosen = [latest is not None, specific is not None, bool(all)]
    if sum(chosen) != 1:
        raise LabBackendsError("choose exactly one version policy: latest=N, specific=[...] or all=True")
    policy = model_config_pb2.ModelVersionPolicy()
    if latest is not None:
        if latest < 1:
            raise LabBackendsError(f"latest=N needs N >= 1, not {latest}")
        policy.latest.num_versions = latest
    elif specific is not None:
        if not specific or any(int(v) < 1 for v in specific):
            raise LabBackendsError(f"specific needs at least one version >= 1, not {list(specific)}")
        policy.specific.versions.extend(int(v) for v in specific)
    else:
        policy.all.SetInParent()
    return policy


def reload_from_disk(server: RunningServer, name: str, timeout_s: float = 30.0) -> None:
    """Unload ``name``, wait until it is gone, and load it again from its folder (``config.pbtxt``).

    Why not just ``load_model(name)``? Measured on Triton 2.51: a load without a config reloads
    only when something in the model's folder is newer than the last load (modification times, core
    model_repository_manager.cc L396-L401 at r24.10); otherwise it is a no-op and a config override
    sent earlier stays in force. Unloading first makes the next load read the folder afresh. (A
    Python stub's first import of a version writes ``__pycache__`` there, which counts as newer:
    :func:`lab_backends.lessons.authoring.write_model` byte-compiles ahead so it does not.)
    """
    server.unload_model(name)
    wait_until_unloaded(server, name, timeout_s)
    server.load_model(name)


def version_states(server: RunningServer, name: str) -> dict[int, str]:
    """``{version: state}`` for every version of ``name`` the server knows, from the repository index.

    The index also lists versions that are *not* being served (``UNAVAILABLE``, reason
    ``unloaded``), unlike the readiness endpoints, which only answer for one version at a time.
    """
    states: dict[int, str] = {}
    for entry in server.repository_index():
        if entry.get("name") == name and entry.get("version"):
            states[int(entry["version"])] = entry.get("state", "")
    return states


def ready_versions(server: RunningServer, name: str) -> list[int]:
    """The versions of ``name`` that are READY, in ascending order."""
    return sorted(v for v, state in version_states(server, name).items() if state == "READY")


def wait_until_unloaded(server: RunningServer, name: str, timeout_s: float = 30.0) -> float:
    """Wait until no version of ``name`` is READY or UNLOADING; returns the seconds it took.

    An unload call returns before the model is gone: Triton lets requests in flight finish first,
    then calls ``finalize``. Anything that depends on the model being gone must wait for this.
    """
    start = time.monotonic()
    states = poll(
        lambda: version_states(server, name),
        lambda seen: not any(state in ("READY", "UNLOADING", "LOADING") for state in seen.values()),
        timeout_s,
    )
    if any(state in ("READY", "UNLOADING", "LOADING") for state in states.values()):
        raise ModelLoadError(name, f"still {states} after {timeout_s:.0f} s", hint="check the server log")
    return time.monotonic() - start


def infer_version(server: RunningServer, name: str, version: int | None = None, protocol: str = "http") -> int:
    """Ask ``name`` (``version`` or the server's choice) and return the VERSION it answered with."""
    kwargs = {"model_version": str(version)} if version is not None else {}
    out = infer(server, name, {"X": np.zeros((1, 1), np.float32)}, protocol=protocol, **kwargs)
    return int(out["VERSION"][0, 0])


@dataclass
class AdminAttempt:
    """What the server answered to one call of a restricted API."""

    status: int
    body: str


def _post(server: RunningServer, path: str, body: bytes, headers: Mapping[str, str]) -> AdminAttempt:
    status, payload = rest.request(
        f"http://{server.http_url}{path}", "POST", body,
        {"Content-Type": "application/json", **headers}, timeout=60,
    )
    return AdminAttempt(status, payload.decode(errors="replace"))


def load_request_body(config: ModelConfig | None = None, files: Mapping[str, bytes] | None = None) -> bytes:
    """The JSON body of ``POST /v2/repository/models/<m>/load``, built as the protocol defines it.

    ``files`` maps ``"file:<version>/<name>"`` to bytes (sent base64-encoded); Triton requires a
    ``config`` whenever files are sent.
    """
    parameters: dict[str, str] = {}
    if config is not None:
        parameters["config"] = config_json(config)
    for path, content in (files or {}).items():
        if not path.startswith("file:"):
            raise LabBackendsError(f"upload paths look like 'file:1/model.py', not {path!r}")
        parameters[path] = b64encode(content).decode()
    if files and config is None:
        raise LabBackendsError("Triton only accepts uploaded files together with a config override")
    return json.dumps({"parameters": parameters} if parameters else {}).encode()


def unauthenticated_load(
    server: RunningServer, name: str, config: ModelConfig | None = None, files: Mapping[str, bytes] | None = None
) -> AdminAttempt:
    """Call the load API *without* the admin key, as any process on the network could."""
    return _post(server, f"/v2/repository/models/{name}/load", load_request_body(config, files), {})


def upload_model(server: RunningServer, name: str, source: str, config: ModelConfig, version: int = 1) -> None:
    """Upload ``source`` as ``<version>/model.py`` with ``config`` through the load API (with the key).

    The server writes the files to a temporary folder and loads them: whoever may call this API
    runs their Python code on the server machine, as the server's user.
    """
    config = copy.deepcopy(config)
    config.name = name
    server.load_model(name, config=config, files={f"file:{int(version)}/model.py": source.encode()})


@dataclass
class InflightUnload:
    """What happened to a slow request while its model was unloaded under it."""

    request_ok: bool
    error: str
    #: How long the request took, from send to answer.
    request_s: float
    #: How long the unload *call* took (it returns at once: unloading happens afterwards).
    unload_call_s: float
    #: Seconds from the unload call to the request's answer, and to the model being gone.
    answered_after_unload_s: float
    gone_after_unload_s: float
    #: The version states right after the unload call, and what a new request got meanwhile.
    states_during: dict[int, str] = field(default_factory=dict)
    new_request_error: str = ""
    output_matches: bool = False


def unload_during_request(
    server: RunningServer, name: str, inputs: Mapping[str, Any], expected: Mapping[str, Any] | None = None,
    unload_after_s: float = 0.3, timeout_s: float = 30.0,
) -> InflightUnload:
    """Send one (slow) request, unload ``name`` while it runs, and report what each side saw.

    The request runs in a thread with its own gRPC client, so the unload (over HTTP, on this
    thread) really overlaps it. ``unload_after_s`` must be shorter than the request's run time.
    """
    box: dict[str, Any] = {}

    def send() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        started = time.monotonic()
        try:
            box["out"] = infer(server, name, inputs, client=client, client_timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - the error is the observation
            box["error"] = str(exc)
        finally:
            box["answered"] = time.monotonic()
            box["request_s"] = box["answered"] - started
            client.close()

    thread = threading.Thread(target=send, name=f"inflight-{name}", daemon=True)
    thread.start()
    time.sleep(unload_after_s)
    if not thread.is_alive():
        raise LabBackendsError(
            f"the request to '{name}' finished within {unload_after_s} s, before the unload: make it slower"
        )
    unload_at = time.monotonic()
    server.unload_model(name)
    unload_call_s = time.monotonic() - unload_at
    states_during = version_states(server, name)
    new_request_error = ""
    try:
        infer(server, name, inputs, protocol="http")
    except Exception as exc:  # noqa: BLE001 - a refusal is what we expect to see
        new_request_error = str(exc)
    thread.join(timeout_s)
    if thread.is_alive():
        raise LabBackendsError(f"the request to '{name}' got no answer within {timeout_s:.0f} s of the unload")
    wait_until_unloaded(server, name, timeout_s)
    gone_after = time.monotonic() - unload_at
    out = box.get("out")
    matches = bool(out) and expected is not None and all(
        np.array_equal(out[k], np.asarray(v)) for k, v in expected.items()
    )
    return InflightUnload(
        request_ok="out" in box, error=box.get("error", ""), request_s=box["request_s"],
        unload_call_s=unload_call_s, answered_after_unload_s=box["answered"] - unload_at,
        gone_after_unload_s=gone_after, states_during=states_during,
        new_request_error=new_request_error, output_matches=matches,
    )
