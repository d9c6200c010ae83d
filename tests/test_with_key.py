"""``lab-backends with-key``: unchanged tritonclient scripts get the admin key of ``serve --admin-key-file``.

One ``lab-backends serve --admin-key-file`` for the module, serving two test-only models written
to a temporary repository: ``wk_simple`` (INT32 sum and difference, like NVIDIA's ``simple``) and
``wk_string`` (the same on BYTES, like ``simple_string``). The scripts below are our own and do
what NVIDIA's examples do (``simple_grpc_infer_client.py``, ``simple_http_infer_client.py``,
``simple_grpc_shm_client.py``, ``simple_http_shm_client.py``, ``simple_grpc_shm_string_client.py``,
model control, an aio client): each passes no admin header of its own, is refused by the server
when run plainly (HTTP 403 / gRPC ``This protocol is restricted``) and passes under ``with-key``.
The same scripts run again against ``serve --front-door``, where the door refuses them (HTTP 403 /
gRPC ``PERMISSION_DENIED``, in the door's words) and ``with-key`` passes them through.

Then NVIDIA's own example clients, unchanged (``src/python/examples`` of triton-inference-server/client
at r24.10, read from a clone at test time: they are in no wheel, and we commit no one else's code), as
an unprivileged user against both servers: those that make an admin call are refused without
``with-key`` and pass with it; the others pass either way. The repository holds seven models (the
model-control examples count them) named as the examples ask: ``simple``, ``simple_string``,
``simple_identity``, two more of the sum-and-difference kind, and ours.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from lab_backends.client.with_key import BOOT_DIR
from lab_backends.server.options import ADMIN_HEADER, GRPC_HEADER_PREFIX
from lab_backends.server.processes import terminate
from lab_backends.waiting import poll
from tests.nvidia_examples import example_source
from tests.reliability.serve_process import require_nginx

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "lab_backends.cli"]

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

STRINGS = {strings}


def as_ints(x):
    return np.array([int(v) for v in x.flat], dtype=np.int32).reshape(x.shape) if STRINGS else x


def as_out(x):
    return np.array([str(v).encode() for v in x.flat], dtype=np.object_).reshape(x.shape) if STRINGS else x


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        """Tensors for a config that names none: NVIDIA's model-control example loads {{"max_batch_size":"16"}}."""
        if not config.as_dict().get("input"):
            for name in ("INPUT0", "INPUT1"):
                config.add_input({{"name": name, "data_type": "{dtype}", "dims": [16]}})
            for name in ("OUTPUT0", "OUTPUT1"):
                config.add_output({{"name": name, "data_type": "{dtype}", "dims": [16]}})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = as_ints(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            b = as_ints(pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", as_out(a + b)), pb_utils.Tensor("OUTPUT1", as_out(a - b))]))
        return responses
'''
IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''
IDENTITY_CONFIG = '''name: "simple_identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''
#: model -> its data type: ours (wk_*), and the names NVIDIA's examples ask for. Seven in all, with simple_identity,
#: as simple_http_model_control.py expects of NVIDIA's test repository (it exits 1 unless the index holds 7;
#: simple_grpc_model_control.py expects 8, and the test adds an eighth folder while it runs).
SUM_AND_DIFFERENCE = {"wk_simple": "TYPE_INT32", "wk_string": "TYPE_STRING", "simple": "TYPE_INT32",
                      "simple_string": "TYPE_STRING", "simple_int8": "TYPE_INT8", "simple_fp32": "TYPE_FP32"}

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }}, {{ name: "INPUT1" data_type: {dtype} dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: {dtype} dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''

#: Shared by the scripts: inputs, and unregistering that retries while a region is still in use. A request
#: releases its region a moment after its answer (server src/shared_memory_manager.cc 686-695 at r24.10:
#: "currently in use"). Unregistering *all* regions hides that reason: UnregisterAll (634-676) logs it
#: and answers only "Failed to unregister the following ... regions: <names>" (a fresh clone's CI
#: failed on exactly that), so both texts are retried, bounded.
PRELUDE = '''
import os, sys, time
import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
url = sys.argv[1]
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.int32)
tag = f"/wk_{os.getpid()}"


IN_USE = ("currently in use", "Failed to unregister the following")


def unregister_all(client):
    for _ in range(250):
        try:
            return client.unregister_system_shared_memory()
        except utils.InferenceServerException as exc:
            if not any(text in str(exc) for text in IN_USE):
                raise
            time.sleep(0.02)
    raise RuntimeError("a region stayed in use for 5 s")
'''

INFER = '''
import tritonclient.{proto} as client_module
client = client_module.InferenceServerClient(url)
inputs = [client_module.InferInput("INPUT0", [1, 16], "INT32"), client_module.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
result = client.infer("wk_simple", inputs, headers={{"test": "1"}})  # the caller's own header (NVIDIA's do)
assert (result.as_numpy("OUTPUT0") == a + b).all() and (result.as_numpy("OUTPUT1") == a - b).all()
stats = client.get_inference_statistics(model_name="wk_simple")  # restricted: statistics
count = len(stats["model_stats"]) if isinstance(stats, dict) else len(stats.model_stats)
assert count == 1, stats
print("PASS")
'''

SHM = '''
import tritonclient.{proto} as client_module
client = client_module.InferenceServerClient(url)
unregister_all(client)  # restricted: shared memory (as NVIDIA's example starts)
n = a.nbytes
out_h = shm.create_shared_memory_region("wk_out", tag + "_out", 2 * n)
in_h = shm.create_shared_memory_region("wk_in", tag + "_in", 2 * n)
try:
    client.register_system_shared_memory("wk_out", tag + "_out", 2 * n)
    shm.set_shared_memory_region(in_h, [a])
    shm.set_shared_memory_region(in_h, [b], offset=n)
    client.register_system_shared_memory("wk_in", tag + "_in", 2 * n)
    inputs = [client_module.InferInput(f"INPUT{{i}}", [1, 16], "INT32") for i in (0, 1)]
    inputs[0].set_shared_memory("wk_in", n)
    inputs[1].set_shared_memory("wk_in", n, offset=n)
    outputs = [client_module.InferRequestedOutput("OUTPUT0"), client_module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("wk_out", n)
    outputs[1].set_shared_memory("wk_out", n, offset=n)
    client.infer("wk_simple", inputs, outputs=outputs)
    assert (shm.get_contents_as_numpy(out_h, np.int32, [1, 16]) == a + b).all()
    assert (shm.get_contents_as_numpy(out_h, np.int32, [1, 16], offset=n) == a - b).all()
    status = client.get_system_shared_memory_status()
    assert "wk_in" in str(status) and "wk_out" in str(status), status
    unregister_all(client)
finally:
    shm.destroy_shared_memory_region(in_h)
    shm.destroy_shared_memory_region(out_h)
print("PASS")
'''

SHM_STRING = '''
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(url)
unregister_all(client)
as_bytes = lambda x: np.array([str(v).encode() for v in x.flat], dtype=np.object_).reshape(x.shape)
ins = [utils.serialize_byte_tensor(as_bytes(x)) for x in (a, b)]
outs = [utils.serialize_byte_tensor(as_bytes(x)) for x in (a + b, a - b)]
sizes = [utils.serialized_byte_size(x) for x in ins + outs]
names = ["wk_s_in0", "wk_s_in1", "wk_s_out0", "wk_s_out1"]
handles = [shm.create_shared_memory_region(name, tag + name, size) for name, size in zip(names, sizes)]
try:
    for handle, data in zip(handles, ins):
        shm.set_shared_memory_region(handle, [data])
    for name, size in zip(names, sizes):
        client.register_system_shared_memory(name, tag + name, size)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    for tensor, name, size in zip(inputs + outputs, names, sizes):
        tensor.set_shared_memory(name, size)
    result = client.infer("wk_string", inputs, outputs=outputs)
    for handle, name, expected in zip(handles[2:], ("OUTPUT0", "OUTPUT1"), (a + b, a - b)):
        out = result.get_output(name)
        got = shm.get_contents_as_numpy(handle, utils.triton_to_np_dtype(out.datatype), out.shape)
        assert (got == as_bytes(expected)).all(), got
    unregister_all(client)
finally:
    for handle in handles:
        shm.destroy_shared_memory_region(handle)
print("PASS")
'''

MODEL_CONTROL = '''
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
http_url, grpc_url = url.split(",")
for client in (grpcclient.InferenceServerClient(grpc_url), httpclient.InferenceServerClient(http_url)):
    index = client.get_model_repository_index()  # restricted: model repository
    names = [m["name"] for m in index] if isinstance(index, list) else [m.name for m in index.models]
    assert "wk_simple" in names, names
    client.unload_model("wk_simple")
    deadline = time.monotonic() + 20
    while client.is_model_ready("wk_simple") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready("wk_simple")
    client.load_model("wk_simple")
    assert client.is_model_ready("wk_simple")
print("PASS")
'''

AIO = '''
import asyncio
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio


async def main():
    for module, address in ((grpcaio, url.split(",")[1]), (httpaio, url.split(",")[0])):
        client = module.InferenceServerClient(address)
        try:
            inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = await client.infer("wk_simple", inputs)
            assert (result.as_numpy("OUTPUT0") == a + b).all()
            stats = await client.get_inference_statistics(model_name="wk_simple")  # restricted
            assert stats
            await client.get_system_shared_memory_status()  # restricted
        finally:
            await client.close()


asyncio.run(main())
print("PASS")
'''

#: script -> (its source, which address it takes, the protocol of its first restricted call)
SCRIPTS = {
    "grpc_infer": (INFER.format(proto="grpc"), "grpc", "grpc"),
    "http_infer": (INFER.format(proto="http"), "http", "http"),
    "grpc_shm": (SHM.format(proto="grpc"), "grpc", "grpc"),
    "http_shm": (SHM.format(proto="http"), "http", "http"),
    "grpc_shm_string": (SHM_STRING, "grpc", "grpc"),
    "model_control": (MODEL_CONTROL, "both", "grpc"),
    "aio": (AIO, "both", "grpc"),
}
#: What Triton answers a restricted call without the key (r24.10: http_server.cc 4748-4762, grpc_server.cc 197-207),
#: and what the front door answers instead (server/door_config.py).
REFUSED = {
    "tritonserver": {
        "http": f"This API is restricted, expecting header '{ADMIN_HEADER}'",
        "grpc": f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}{ADMIN_HEADER}'",
    },
    "front door": {
        "http": "the front door refuses this admin API without the admin key",
        "grpc": "the front door refuses this admin method without the admin key",
    },
}


@dataclass
class Served:
    http: str
    grpc: str
    key_file: Path
    banner: str
    tmp: Path
    before: str  #: who answers at the ports: "tritonserver" or "front door"


def _environment() -> dict[str, str]:
    """This process's environment without any key (the tests hand it over themselves)."""
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_ADMIN_KEY", "LAB_WITH_KEY_FILE", "TRITON_URL")}


@pytest.fixture(scope="module", params=["tritonserver", "front door"])
def served(request, tmp_path_factory):
    """``lab-backends serve --admin-key-file`` on wk_simple and wk_string, stopped by PID (SIGTERM, then SIGKILL);
    then the same with ``--front-door`` (nginx before tritonserver: ``make door-deps``)."""
    if request.param == "front door":
        require_nginx()
    tmp = tmp_path_factory.mktemp("with_key")
    for name, dtype in SUM_AND_DIFFERENCE.items():
        (tmp / "repo" / name / "1").mkdir(parents=True)
        (tmp / "repo" / name / "config.pbtxt").write_text(CONFIG.format(name=name, dtype=dtype))
        (tmp / "repo" / name / "1" / "model.py").write_text(MODEL.format(strings=dtype == "TYPE_STRING", dtype=dtype))
    (tmp / "repo" / "simple_identity" / "1").mkdir(parents=True)
    (tmp / "repo" / "simple_identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (tmp / "repo" / "simple_identity" / "1" / "model.py").write_text(IDENTITY)
    for name, (source, _, _) in SCRIPTS.items():
        (tmp / f"{name}.py").write_text(PRELUDE + source)
    key_file, out, err = tmp / "admin.key", tmp / "serve.out", tmp / "serve.err"
    door = ["--front-door"] if request.param == "front door" else []
    proc = subprocess.Popen([*CLI, "serve", "--model-repository", str(tmp / "repo"), "--admin-key-file", str(key_file),
                             *door], cwd=ROOT, stdout=open(out, "w"), stderr=open(err, "w"), env=_environment())
    try:
        text = poll(out.read_text, lambda t: "Ctrl-C stops" in t or proc.poll() is not None, 120, 0.2)
        assert "Ctrl-C stops" in text, f"serve did not start:\n{text}\n{err.read_text()}"
        yield Served(re.search(r"HTTP/REST : http://(\S+)", text).group(1), re.search(r"gRPC +: (\S+)", text).group(1),
                     key_file, text + err.read_text(), tmp, request.param)
    finally:
        terminate(proc)


def _run(served: Served, name: str, wrapped: bool) -> subprocess.CompletedProcess:
    address = {"http": served.http, "grpc": served.grpc, "both": f"{served.http},{served.grpc}"}[SCRIPTS[name][1]]
    return _run_command(served, [sys.executable, str(served.tmp / f"{name}.py"), address], wrapped)


def _run_command(served: Served, command: list[str], wrapped: bool) -> subprocess.CompletedProcess:
    if wrapped:
        command = [*CLI, "with-key", "--key-file", str(served.key_file), "--", *command]
    return subprocess.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=120)


@pytest.mark.server
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_an_unchanged_client_is_refused_alone_and_passes_under_with_key(served, name):
    bare = _run(served, name, wrapped=False)
    assert bare.returncode != 0 and REFUSED[served.before][SCRIPTS[name][2]] in bare.stderr, (
        f"{name} without with-key: rc {bare.returncode}\n{bare.stdout}\n{bare.stderr[-2000:]}")
    wrapped = _run(served, name, wrapped=True)
    assert wrapped.returncode == 0 and "PASS" in wrapped.stdout, (
        f"{name} under with-key: rc {wrapped.returncode}\n{wrapped.stdout}\n{wrapped.stderr[-2000:]}")


@pytest.mark.server
def test_the_key_file_banner_names_both_headers_and_with_key(served):
    key = served.key_file.read_text().strip()
    assert f"HTTP header '{ADMIN_HEADER}'" in served.banner
    assert f"gRPC metadata '{GRPC_HEADER_PREFIX}{ADMIN_HEADER}'" in served.banner
    assert f"lab-backends with-key --key-file {served.key_file}" in served.banner
    assert key not in served.banner


#: example -> (the address it takes, the protocol of its first restricted call; None: it makes none). Left out: the
#: shared-memory examples, which unregister every region right after their request, when Triton 2.51 may still
#: answer "currently in use" (see PRELUDE): the look-alikes above retry that, NVIDIA's do not.
EXAMPLES = {
    "simple_grpc_infer_client": ("grpc", "grpc"),          # statistics
    "simple_http_infer_client": ("http", "http"),
    "simple_grpc_aio_infer_client": ("grpc", "grpc"),
    "simple_http_aio_infer_client": ("http", "http"),
    "simple_grpc_model_control": ("grpc", "grpc"),         # repository index, load, unload
    "simple_http_model_control": ("http", "http"),
    "simple_grpc_health_metadata": ("grpc", None),
    "simple_http_health_metadata": ("http", None),
    "simple_grpc_string_infer_client": ("grpc", None),
    "simple_http_string_infer_client": ("http", None),
    "simple_grpc_async_infer_client": ("grpc", None),
    "simple_http_async_infer_client": ("http", None),
}


#: Who runs NVIDIA's examples: as root (CI is), an unprivileged user, as the issue asks; else whoever runs the tests.
EXAMPLE_USER = "nobody"


@pytest.fixture(scope="module")
def nvidia_examples() -> Iterator[Path]:
    """NVIDIA's example clients (tests/nvidia_examples.py), unchanged, where :data:`EXAMPLE_USER` reads them."""
    sources = {name: example_source(name) for name in EXAMPLES}
    folder = Path(tempfile.mkdtemp(prefix="nvidia-examples-"))
    try:
        folder.chmod(0o755)
        for name, source in sources.items():
            (folder / f"{name}.py").write_bytes(source)
            (folder / f"{name}.py").chmod(0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_example_user(served: Served, folder: Path, command: list[str], wrapped: bool) -> subprocess.CompletedProcess:
    """``command``, under with-key or not, as :data:`EXAMPLE_USER` when we are root, with a key file of its own
    (its owner's alone, as ``serve --admin-key-file`` writes one); as ourselves otherwise."""
    if os.geteuid() != 0:
        return _run_command(served, command, wrapped)
    user = pwd.getpwnam(EXAMPLE_USER)
    key_file = folder / f"{served.before.replace(' ', '_')}.key"
    if not key_file.exists():
        key_file.write_text(served.key_file.read_text())
        os.chown(key_file, user.pw_uid, user.pw_gid)
        key_file.chmod(0o600)
    if wrapped:
        command = [*CLI, "with-key", "--key-file", str(key_file), "--", *command]
    # As the class runs a learner (deferred: the class's layer, only as root): the interpreter lives under /root
    # (pyenv, 0700) here, which the spawner's mount namespace exposes; setpriv alone runs only the first python.
    from lab_backends.classroom.spawner import namespace_command

    return subprocess.run(namespace_command(EXAMPLE_USER, command), cwd="/", env={**_environment(), "HOME": "/"},
                          capture_output=True, text=True, timeout=120)


def _reload_simple(served: Served) -> None:
    """The model-control example ends with `simple` unloaded: load it again, as its administrator would."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served.http)
    try:
        client.load_model("simple", headers={ADMIN_HEADER: served.key_file.read_text().strip()})
    finally:
        client.close()


@pytest.mark.server
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_nvidias_unchanged_example_passes_under_with_key_and_is_refused_its_admin_calls_without(
        served, nvidia_examples, name):
    kind, restricted = EXAMPLES[name]
    address = served.http if kind == "http" else served.grpc
    command = [sys.executable, str(nvidia_examples / f"{name}.py"), "-u", address]
    bare = _as_example_user(served, nvidia_examples, command, wrapped=False)
    said = f"rc {bare.returncode}\n{bare.stdout[-1500:]}\n{bare.stderr[-1500:]}"
    if restricted:
        assert bare.returncode != 0 and REFUSED[served.before][restricted] in bare.stdout + bare.stderr, said
    else:
        assert bare.returncode == 0 and "FAILED" not in bare.stdout and "error:" not in bare.stdout, said
    eighth = served.tmp / "repo" / "simple_eighth"  # the gRPC model-control example counts 8 models, HTTP's 7
    if name == "simple_grpc_model_control":
        shutil.copytree(served.tmp / "repo" / "simple_fp32", eighth)
        (eighth / "config.pbtxt").write_text(CONFIG.format(name=eighth.name, dtype="TYPE_FP32"))
    try:
        wrapped = _as_example_user(served, nvidia_examples, command, wrapped=True)
    finally:
        shutil.rmtree(eighth, ignore_errors=True)
        if "model_control" in name:
            _reload_simple(served)
    assert wrapped.returncode == 0 and "FAILED" not in wrapped.stdout and "error:" not in wrapped.stdout, (
        f"{name} under with-key: rc {wrapped.returncode}\n{wrapped.stdout[-1500:]}\n{wrapped.stderr[-1500:]}")


#: Run under with-key without a server: which headers each client class would send (the hook itself).
PROBE = '''
import asyncio, json, os, sys
import tritonclient.grpc as g, tritonclient.grpc.aio as ga, tritonclient.http as h, tritonclient.http.aio as ha
from tritonclient._auth import BasicAuth
from tritonclient._request import Request

def sent(client, headers):
    request = Request(headers)
    client._call_plugin(request)
    return dict(request.headers)

async def main():
    http, grpc = h.InferenceServerClient("127.0.0.1:1"), g.InferenceServerClient("127.0.0.1:1")
    http_aio, grpc_aio = ha.InferenceServerClient("127.0.0.1:1"), ga.InferenceServerClient("127.0.0.1:1")
    given = {"test": "1"}
    out = {"http": sent(http, None), "grpc": sent(grpc, given), "http_aio": sent(http_aio, None),
           "grpc_aio": dict(grpc_aio._get_metadata(None)), "own": sent(http, {"Admin-Key": "mine"}),
           "given_untouched": given == {"test": "1"}}
    http.register_plugin(BasicAuth("u", "p"))
    out["plugin"] = sent(http, None)
    out["key_in_environ"] = any(KEY in v for v in os.environ.values())
    out["key_on_command_line"] = KEY in open("/proc/self/cmdline").read()
    out["boot_on_sys_path"] = BOOT in sys.path
    await http_aio.close()
    print(json.dumps(out))

asyncio.run(main())
'''


def _probe(tmp_path: Path, key: str, *with_key_args: str, env: dict[str, str] | None = None) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(f"KEY = {key!r}\nBOOT = {str(BOOT_DIR)!r}\n" + PROBE)
    done = subprocess.run([*CLI, "with-key", *with_key_args, "--", sys.executable, str(script)], cwd=ROOT,
                          env={**_environment(), **(env or {})}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_client_class_gets_its_protocols_header_unless_it_gave_one(tmp_path):
    key = "probe-key-0123456789abcdef"
    key_file = tmp_path / "k"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    got = _probe(tmp_path, key, "--key-file", str(key_file))
    http, grpc = {ADMIN_HEADER: key}, {GRPC_HEADER_PREFIX + ADMIN_HEADER: key}
    assert got["http"] == http and got["http_aio"] == http
    assert got["grpc"] == {"test": "1", **grpc} and got["grpc_aio"] == grpc
    assert got["own"] == {"Admin-Key": "mine"}  # the caller's header wins, whatever its case
    assert got["given_untouched"]  # the caller's dict is not modified
    assert got["plugin"] == {"authorization": "Basic dTpw", **http}  # a registered plugin still runs
    assert not got["key_in_environ"] and not got["key_on_command_line"] and not got["boot_on_sys_path"]
    # Without --key-file, the key already in TRITON_ADMIN_KEY is used.
    from_env = _probe(tmp_path, key, env={"TRITON_ADMIN_KEY": key})
    assert from_env["http"] == http and from_env["grpc_aio"] == grpc


def test_with_key_refuses_in_one_line_and_passes_the_exit_code(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "with-key", *args], cwd=ROOT, env=_environment(), capture_output=True,
                              text=True, timeout=60)

    no_key = run("--", sys.executable, "-c", "pass")
    assert no_key.returncode == 2 and "no admin key" in no_key.stderr and no_key.stderr.count("\n") == 1
    missing = run("--key-file", str(tmp_path / "absent"), "--", sys.executable, "-c", "pass")
    assert missing.returncode == 2 and "serve --admin-key-file" in missing.stderr
    key_file = tmp_path / "k"
    key_file.write_text("k" * 20)
    key_file.chmod(0o644)
    assert "no command" in run("--key-file", str(key_file)).stderr
    code = run("--key-file", str(key_file), "--", sys.executable, "-c", "raise SystemExit(7)")
    assert code.returncode == 7 and "readable by other users" in code.stderr
