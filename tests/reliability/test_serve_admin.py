"""``lab-backends serve`` with upstream ``tritonclient`` flows: statistics, shared memory, model control.

Both ways the issue asks for: the key handed over in a 0600 file (``--admin-key-file``, HTTP
header and gRPC metadata), and no key at all (``--open-admin-apis``, with its printed warning).
The key-file server also runs with ``--restart`` and is crashed once (an upstream crasher): the
supervisor reports it, restarts it on the same ports with the same key, and the flows pass again.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.waiting import poll
from tests.reliability.serve_process import Serve

pytestmark = pytest.mark.server


def _unregister(client, name: str, headers: dict[str, str]) -> None:
    """Unregister a region, retrying Triton's "currently in use" for up to 5 s.

    The server holds a region while any request reading it is alive, and a request is released a
    moment after its response (server ``src/shared_memory_manager.cc`` 686-695 at r24.10 refuses
    while ``use_count() > 1``): unregistering right after the answer races that release (seen in a
    flake hunt with one core busy).
    """
    def attempt() -> str:
        try:
            client.unregister_system_shared_memory(name, headers=headers)
            return ""
        except InferenceServerException as exc:
            return str(exc)

    error = poll(attempt, lambda e: "currently in use" not in e, 5.0, 0.02)
    assert error == "", error


def _flows(serve: Serve, http_headers: dict[str, str], grpc_headers: dict[str, str]) -> None:
    """The three restricted flows of tritonclient's examples, over HTTP and gRPC."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    for module, url, headers in ((httpclient, serve.http, http_headers), (grpcclient, serve.grpc, grpc_headers)):
        client = module.InferenceServerClient(url)
        try:
            stats = client.get_inference_statistics("rel_double", headers=headers)
            assert stats and ("model_stats" in stats if isinstance(stats, dict) else stats.model_stats)
            client.unload_model("rel_double", headers=headers)
            poll(lambda: client.is_model_ready("rel_double"), lambda ready: not ready, 20, 0.1)
            client.load_model("rel_double", headers=headers)
            assert client.is_model_ready("rel_double")
            region = f"/i20_{os.getpid()}_{module.__name__.rsplit('.', 1)[-1]}"
            handle = shm.create_shared_memory_region("i20_in", region, x.nbytes)
            try:
                shm.set_shared_memory_region(handle, [x])
                client.register_system_shared_memory("i20_in", region, x.nbytes, headers=headers)
                tensor = module.InferInput("INPUT0", [1, 16], "FP32")
                tensor.set_shared_memory("i20_in", x.nbytes)
                out = client.infer("rel_double", [tensor], headers=headers).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, 2 * x)
                _unregister(client, "i20_in", headers)
            finally:
                shm.destroy_shared_memory_region(handle)
        finally:
            client.close()


def test_admin_key_file_with_restart(tmp_path):
    key_file = tmp_path / "admin.key"
    serve = Serve(tmp_path, "--admin-key-file", str(key_file), "--restart")
    try:
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) >= 16 and key not in serve.out.read_text() + serve.err.read_text()
        for module, url in ((httpclient, serve.http), (grpcclient, serve.grpc)):
            client = module.InferenceServerClient(url)
            with pytest.raises(InferenceServerException):
                client.get_inference_statistics("rel_double")  # no key: refused
            client.close()
        http_headers, grpc_headers = {"admin-key": key}, {"triton-grpc-protocol-admin-key": key}
        _flows(serve, http_headers, grpc_headers)
        try:  # an upstream crasher (test_crashes.py::nested_json): the supervisor restarts it
            rest.request(f"http://{serve.http}/v2/models/rel_double/infer", "POST",
                         b'{"inputs":' + b"[" * 200_000, {"Content-Type": "text/plain"}, 10)
        except OSError:
            pass
        err = poll(serve.err.read_text, lambda t: "restarted: pid" in t or serve.proc.poll() is not None, 60, 0.2)
        assert "SIGSEGV" in err and "restarted: pid" in err, err
        _flows(serve, http_headers, grpc_headers)
    finally:
        serve.stop()
    assert serve.proc.returncode == 0


def test_open_admin_apis_warns_and_needs_no_key(tmp_path):
    serve = Serve(tmp_path, "--open-admin-apis")
    try:
        assert "admin APIs are OPEN" in serve.err.read_text()
        _flows(serve, {}, {})
    finally:
        serve.stop()


def test_admin_key_from_the_environment(tmp_path):
    """TRITON_ADMIN_KEY chooses the key written to the file (checked without starting a server)."""
    from lab_backends.server import admin

    assert admin.serve_options(None, False, {"TRITON_ADMIN_KEY": "k" * 20}) == {"admin_key": "k" * 20}
    assert admin.serve_options(None, True, {}) == {"restricted_apis": ()}
    path = admin.write_key_file(tmp_path / "k", "secret-value-123456")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
