"""The foundation against a real tritonserver: lifecycle, two servers, broken configs, orphans, sockets."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from lab_backends.client.infer import infer
from lab_backends.errors import (
    EnvironmentMismatchError,
    LabBackendsError,
    ModelLoadError,
    PortInUseError,
    RemoteServerError,
    ServerBinaryNotFoundError,
    ServerStartupTimeoutError,
)
from lab_backends.measure.stats import rows_since
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server import bundle
from lab_backends.server.ports import free_ports
from lab_backends.server.processes import SHM_DIR, alive, group_members
from lab_backends.server.triton_server import TritonServer

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parent.parent


def _payload(rows: int = 2) -> np.ndarray:
    return np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)


def _tree(pid: int) -> list[int]:
    """The server and every process it forked (stubs)."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        time.sleep(0.1)
    return left


def _copy_model(repo: Path, name: str = "cost_model") -> None:
    shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))


def test_start_infer_over_http_and_grpc_then_stop(start_server):
    server = start_server(models=["cost_model"])
    assert server.is_ready()
    x = _payload()
    out_http = infer(server, "cost_model", {"INPUT0": x}, protocol="http")["OUTPUT0"]
    out_grpc = infer(server, "cost_model", {"INPUT0": x}, protocol="grpc")["OUTPUT0"]
    np.testing.assert_array_equal(out_http, x)
    np.testing.assert_array_equal(out_grpc, x)
    assert server.http_client.is_server_live()
    assert server.grpc_client.is_server_ready()
    assert server.log_path.exists()

    pids = _tree(server.pid)
    assert len(pids) >= 2, "expected the server plus a Python backend stub"
    shm = {a for p in pids[1:] for a in psutil.Process(p).cmdline() if a.startswith("triton_python_backend_shm")}
    assert shm, "the stub names its shared-memory region on its command line"
    server.stop()
    assert _wait_gone(pids, 1.0) == []
    assert not [name for name in shm if (SHM_DIR / name).exists()], "stop() must remove its /dev/shm regions"
    assert not server.is_running()


def test_two_servers_side_by_side(start_server):
    a = start_server(models=["cost_model"])
    b = start_server(models=["cost_model"])
    assert len({a.http_port, a.grpc_port, a.metrics_port, b.http_port, b.grpc_port, b.metrics_port}) == 6
    x = _payload(1)
    np.testing.assert_array_equal(infer(a, "cost_model", {"INPUT0": x})["OUTPUT0"], x)
    np.testing.assert_array_equal(infer(b, "cost_model", {"INPUT0": x + 1})["OUTPUT0"], x + 1)
    # Triton counts a request as it releases it, a moment after the answer (a flake hunt once read 0).
    counts = rows_since(a, "cost_model", 0, 1), rows_since(b, "cost_model", 0, 1)
    assert counts == (1, 1), "each server counts only its own request"
    a.stop()
    assert b.is_ready(), "stopping one server leaves the other serving"


def test_broken_config_names_the_model_fast(tmp_path):
    _copy_model(tmp_path)
    broken = tmp_path / "broken_model"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.py").write_text("")
    (broken / "config.pbtxt").write_text(
        'name: "broken_model"\nbackend: "python"\nmax_batch_size: 4\ninput [ { name: "X" \n'
    )
    started = time.monotonic()
    with pytest.raises(ModelLoadError) as info:
        TritonServer(tmp_path).start()
    assert time.monotonic() - started < 15
    assert info.value.model == "broken_model"
    message = str(info.value)
    assert "broken_model" in message and "config.pbtxt" in message
    assert "Expected" in message, "the protobuf parse error (what is wrong) is quoted"


def test_allow_broken_models_keeps_serving_the_rest(tmp_path, start_server):
    _copy_model(tmp_path)
    broken = tmp_path / "raises_in_init" / "1"
    broken.mkdir(parents=True)
    (broken / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('weights missing')\n"
    )
    (tmp_path / "raises_in_init" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    server = start_server(model_repository=tmp_path, allow_broken_models=True)
    assert "weights missing" in server.broken_models["raises_in_init"]
    x = _payload(1)
    np.testing.assert_array_equal(infer(server, "cost_model", {"INPUT0": x})["OUTPUT0"], x)


def test_unknown_model_is_named(tmp_path):
    _copy_model(tmp_path)
    with pytest.raises(ModelLoadError, match="no_such_model"):
        TritonServer(tmp_path, models=["no_such_model"]).start()


def test_startup_deadline_stops_the_server(tmp_path):
    slow = tmp_path / "slow_model" / "1"
    slow.mkdir(parents=True)
    (slow / "model.py").write_text(
        "import time\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(60)\n"
        "    def execute(self, requests):\n        return []\n"
    )
    (tmp_path / "slow_model" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    server = TritonServer(tmp_path, startup_timeout_s=6, exit_timeout_s=1)
    with pytest.raises(ServerStartupTimeoutError, match="slow_model"):
        server.start()
    assert server.process is None
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert _wait_gone(leftovers, 10) == []


def test_taken_port_is_reported(start_server):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortInUseError, match=str(port)):
            TritonServer(models=["cost_model"], http_port=port).start()


def test_only_loopback_is_listening(start_server):
    server = start_server(models=["cost_model"])
    listening = [
        c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
    ]
    assert {addr.port for addr in listening} >= {server.http_port, server.grpc_port, server.metrics_port}
    # gRPC listens on an IPv6 socket with the v4-mapped loopback (::ffff:127.0.0.1): still loopback only.
    ips = {ipaddress.ip_address(addr.ip) for addr in listening}
    assert {str(getattr(ip, "ipv4_mapped", None) or ip) for ip in ips} == {"127.0.0.1"}, listening


def test_admin_apis_need_the_key(start_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server = start_server(models=["cost_model"])
    with pytest.raises(InferenceServerException, match="restricted"):
        server.http_client.get_inference_statistics("cost_model")
    assert server.statistics("cost_model")["model_stats"][0]["name"] == "cost_model"
    assert server.admin_key not in repr(server) and server.admin_key not in server.log_text()
    assert isinstance(server.http_client, httpclient.InferenceServerClient)


def test_remote_target_uses_an_existing_server(start_server):
    local = start_server(models=["cost_model"])
    remote = TritonServer(url=f"http://{local.http_url}", grpc_url=local.grpc_url, admin_key=local.admin_key)
    assert remote.target == "remote"
    remote.start()
    x = _payload(1)
    np.testing.assert_array_equal(infer(remote, "cost_model", {"INPUT0": x})["OUTPUT0"], x)
    assert remote.statistics("cost_model")["model_stats"][0]["name"] == "cost_model"
    remote.stop()
    assert local.is_ready(), "stopping a remote target stops nothing"


def test_remote_target_without_a_server_fails_clearly():
    port = free_ports(1)[0]
    with pytest.raises(RemoteServerError, match="unset TRITON_URL"):
        TritonServer(url=f"127.0.0.1:{port}", startup_timeout_s=1).start()


_OWNER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from lab_backends import TritonServer
    server = TritonServer(models=["cost_model"]).start()
    print(server.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_owner_leaves_no_server_or_stub(sig):
    owner = subprocess.Popen([sys.executable, "-c", _OWNER.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(owner.stdout.readline())
        pids = _tree(server_pid)
        assert len(pids) >= 2
        owner.send_signal(sig)
        owner.wait(timeout=10)
        assert _wait_gone(pids, 30) == [], "the watchdog must stop the server and its stubs"
        assert group_members(server_pid) == []
    finally:
        if owner.poll() is None:
            owner.kill()


def test_cli_serve_runs_until_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab_backends.cli", "serve", "--model", "cost_model"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "metrics" in line or not line:
                break
        text = "".join(lines)
        pid = int(text.split("pid ")[1].split(")")[0])
        http = text.split("HTTP/REST : http://")[1].split()[0]
        grpc = text.split("gRPC      : ")[1].split()[0]
        remote = TritonServer(url=http, grpc_url=grpc).start()
        x = _payload(1)
        np.testing.assert_array_equal(infer(remote, "cost_model", {"INPUT0": x}, protocol="http")["OUTPUT0"], x)
        pids = _tree(pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read()
        assert _wait_gone(pids, 5) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_missing_stub_says_what_to_do(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 99, 0))
    with pytest.raises(ServerBinaryNotFoundError, match="Python 3.99"):
        bundle.find_bundle()


def test_numpy2_is_refused(monkeypatch):
    monkeypatch.setattr(bundle.importlib.metadata, "version", lambda name: "2.1.0")
    with pytest.raises(EnvironmentMismatchError, match="numpy<2"):
        bundle.check_model_environment()


def test_model_code_runs_in_this_environment(tmp_path, start_server):
    """The stub ignores PYTHONPATH: model.py must still see this venv (and its numpy<2)."""
    probe = tmp_path / "env_probe" / "1"
    probe.mkdir(parents=True)
    (probe / "model.py").write_text(
        textwrap.dedent(
            """
            import sys
            import numpy as np
            import triton_python_backend_utils as pb_utils

            class TritonPythonModel:
                def execute(self, requests):
                    text = np.array([f"{sys.prefix}|{np.__version__}".encode()], dtype=object)
                    return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]) for _ in requests]
            """
        )
    )
    (tmp_path / "env_probe" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )
    server = start_server(model_repository=tmp_path)
    out = infer(server, "env_probe", {"IN": np.zeros(1, np.float32)})["OUT"][0].decode()
    prefix, numpy_version = out.split("|")
    assert os.path.realpath(prefix) == os.path.realpath(sys.prefix)
    assert numpy_version.startswith("1.")


def test_killed_stub_leaves_no_shm_after_stop(start_server):
    """Triton never unlinks the region of a stub killed with SIGKILL; stop() must."""
    server = start_server(models=["cost_model"])
    stub = psutil.Process(_tree(server.pid)[1])
    region = next(a for a in stub.cmdline() if a.startswith("triton_python_backend_shm"))
    stub.kill()
    assert _wait_gone([stub.pid], 5) == []  # a zombie until Triton reaps it: dead either way
    server.unload_model("cost_model")
    server.load_model("cost_model")  # the recovery path: a new stub, a new region
    x = _payload(1)
    np.testing.assert_array_equal(infer(server, "cost_model", {"INPUT0": x})["OUTPUT0"], x)
    server.stop()
    assert not (SHM_DIR / region).exists(), "the dead stub's region must be removed"


def test_refused_load_quotes_tritons_reason(start_server):
    """The load API only says 'failed to poll'; the error must carry the reason from the log."""
    server = start_server(models=["cost_model"])
    config = server.model_config("cost_model")
    config.max_batch_size = 4
    config.dynamic_batching.preferred_batch_size.append(16)  # larger than max_batch_size: refused
    with pytest.raises(ModelLoadError) as info:
        server.load_model("cost_model", config=config)
    assert info.value.model == "cost_model"
    assert "preferred size must be <= max batch size" in str(info.value), str(info.value)
    x = _payload(1)
    np.testing.assert_array_equal(infer(server, "cost_model", {"INPUT0": x})["OUTPUT0"], x)


def test_own_folders_never_follow_triton_url_silently(monkeypatch, tmp_path) -> None:
    """With TRITON_URL set, a server given its own repository or backends must say it cannot be the
    remote one, instead of serving the lesson from the remote server's models."""
    monkeypatch.setenv("TRITON_URL", "http://127.0.0.1:9")
    for own in ({"model_repository": tmp_path}, {"backend_dir": tmp_path}):
        with pytest.raises(LabBackendsError, match='target="local"') as refused:
            TritonServer(**own)
        assert next(iter(own)) in str(refused.value)
    assert TritonServer(tmp_path, backend_dir=tmp_path, target="local").target == "local"  # nothing starts
    assert TritonServer(models=["echo"]).target == "remote"  # the shared server, as before
