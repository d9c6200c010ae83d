"""Nobody in: loopback only, admin APIs behind a per-server key that is never shown, a token on
JupyterLab, and no secrets committed.

The threat these tests stand for: a learner runs the workbench on a laptop on a café network.
Triton's model-repository API can upload and run arbitrary ``model.py`` code, so it must be
neither reachable from the network nor usable without the key by another local program.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.errors import ModelLoadError
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.options import RESTRICTED_APIS
from lab_backends.server.ports import free_ports
from lab_backends.server.processes import SHM_DIR, alive, children, group_members, shm_regions
from lab_backends.server.triton_server import TritonServer

from .conftest import REPOSITORIES, known_good

pytestmark = pytest.mark.server

LOOPBACK = ipaddress.ip_address("127.0.0.1")


# ---------------------------------------------------------------------------- helpers

def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    return rest.request(url, "POST", body, headers, timeout=10.0)


def _get(url: str) -> tuple[int, bytes]:
    return rest.request(url, "GET", timeout=2.0)

def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket and bound UDP socket of these processes."""
    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN or (conn.type == 2 and conn.laddr):  # 2: SOCK_DGRAM
                found.append((pid, conn.laddr.ip, conn.laddr.port))
    return found


def _cmdlines(pids: list[int]) -> list[str]:
    """Command lines of these processes; one that exits (or is a zombie) meanwhile has none to leak.

    JupyterLab starts short-lived helpers in its group: one that ended between the /proc listing and
    this read raised psutil.ZombieProcess in CI (stop 30).
    """
    found = []
    for pid in pids:
        try:
            found.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess
            continue
    return found


def _is_loopback_v4(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # gRPC listens on ::ffff:127.0.0.1 (measured)
    return (mapped or ip) == LOOPBACK


def _request(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    """(status, body, location) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Location", "")


# ---------------------------------------------------------------------------- network
def test_server_and_stubs_listen_on_127_0_0_1_only(rel_server):
    pids = group_members(rel_server.pid)
    sockets = _listening(pids)
    assert sockets, "found no listening socket at all: the check would prove nothing"
    assert [s for s in sockets if not _is_loopback_v4(s[1])] == []
    ports = {port for _, _, port in sockets}
    assert {rel_server.http_port, rel_server.grpc_port, rel_server.metrics_port} <= ports


def _umask(pid: int) -> int:
    """The umask of a process: the kernel's /proc status line (psutil has no reader for it)."""
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Umask:"))
    return int(line.split()[1], 8)


@pytest.mark.upstream
def test_a_stubs_shared_memory_is_readable_by_everyone_whatever_the_umask(rel_server):
    """The server and its stubs run with umask 077 (server/limits.py), yet each stub's region is 0644:
    python_backend creates it with boost.interprocess's default permissions (src/shm_manager.cc L96-L97
    at r24.10: none given), and boost sets them with ``fchmod`` after ``shm_open``, past the umask. So
    on a shared machine any local user can read the tensors in them; only a private ``/dev/shm`` (a
    mount namespace per user) keeps them apart. Fails the day the regions come out private."""
    known_good(rel_server)  # a request went through the regions
    pids = [rel_server.pid, *children(rel_server.pid)]
    assert {_umask(pid) for pid in pids} == {0o077}
    regions = shm_regions(pids)
    assert regions, "found no Python-backend region: the check would prove nothing"
    modes = {name: stat.S_IMODE((SHM_DIR / name).stat().st_mode) for name in regions}
    assert set(modes.values()) == {0o644}, f"UPSTREAM FIXED? {({n: oct(m) for n, m in modes.items()})}"


# ---------------------------------------------------------------------------- admin key
HTTP_RESTRICTED = {
    "model-repository": ("POST", "/v2/repository/index", b"{}"),
    "statistics": ("GET", "/v2/models/rel_double/stats", None),
    "trace": ("GET", "/v2/trace/setting", None),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status", None),
    "logging": ("GET", "/v2/logging", None),
}


def test_every_restricted_api_is_covered():
    assert set(HTTP_RESTRICTED) == set(RESTRICTED_APIS)


@pytest.mark.parametrize("api", sorted(HTTP_RESTRICTED))
def test_http_admin_api_refuses_without_the_key_and_works_with_it(rel_server, api):
    method, path, body = HTTP_RESTRICTED[api]
    url = f"http://{rel_server.http_url}{path}"
    for headers in ({}, {"admin-key": "wrong-" + "x" * 16}):
        status, answer, _ = _request(url, method, body, headers)
        assert status == 403, (api, headers, answer)
    status, answer, _ = _request(url, method, body, rel_server.admin_headers)
    assert status == 200, (api, answer)


def test_unauthenticated_code_upload_is_refused_and_runs_nothing(rel_server, tmp_path):
    """What notebook 07 shows: a load with an uploaded model.py, without the key: 403."""
    marker = tmp_path / "pwned"
    code = (f"open({str(marker)!r}, 'w').write('ran')\n"
            "class TritonPythonModel:\n    def execute(self, r):\n        return []\n")
    config = {"name": "intruder", "backend": "python", "max_batch_size": 0}
    payload = {
        "parameters": {"config": json.dumps(config), "file:1/model.py": base64.b64encode(code.encode()).decode()}
    }
    status, answer = _post(
        f"http://{rel_server.http_url}/v2/repository/models/intruder/load",
        json.dumps(payload).encode(), {"Content-Type": "application/json"},
    )
    assert status == 403, answer
    assert b"restricted" in answer.lower()
    time.sleep(0.5)
    assert not marker.exists()
    assert "intruder" not in {e["name"] for e in rel_server.repository_index()}
    status, _ = _post(
        f"http://{rel_server.http_url}/v2/repository/models/rel_double/unload", b"{}",
        {"Content-Type": "application/json"},
    )
    assert status == 403
    known_good(rel_server)  # still loaded: the unauthenticated unload did nothing

    # The same request with the key is a working upload: the refusal above was the key, not the form.
    status, answer = _post(
        f"http://{rel_server.http_url}/v2/repository/models/intruder/load",
        json.dumps(payload).encode(), {"Content-Type": "application/json", **rel_server.admin_headers},
    )
    try:
        assert status == 200, answer
        assert marker.read_text() == "ran"
    finally:
        rel_server.unload_model("intruder")


def test_inference_and_health_stay_open(rel_server):
    assert _get(f"http://{rel_server.http_url}/v2/health/ready")[0] == 200
    assert _get(f"http://{rel_server.http_url}/v2/models/rel_double")[0] == 200
    known_good(rel_server, "http")


GRPC_RESTRICTED = {
    "model-repository": lambda c, h: c.get_model_repository_index(headers=h),
    "statistics": lambda c, h: c.get_inference_statistics("rel_double", headers=h),
    "trace": lambda c, h: c.get_trace_settings(headers=h),
    "shared-memory": lambda c, h: c.get_system_shared_memory_status(headers=h),
    "logging": lambda c, h: c.get_log_settings(headers=h),
}


@pytest.mark.parametrize("api", sorted(GRPC_RESTRICTED))
def test_grpc_admin_api_refuses_without_the_key_and_works_with_it(rel_server, api):
    call = GRPC_RESTRICTED[api]
    client = rel_server.grpc_client
    with pytest.raises(InferenceServerException) as caught:
        call(client, None)
    assert "restricted" in caught.value.message()
    call(client, rel_server.grpc_admin_headers)  # does not raise


@pytest.mark.upstream
def test_a_grpc_load_of_a_dotted_name_loads_a_model_from_beside_the_repository(tmp_path):
    """Triton 2.51 joins a load's model name to the repository path as it is: with the key, gRPC
    ``load_model("../outside")`` loads (and runs the code of) the model in the folder next to the
    repository. Fails the day an upgrade refuses the name; ``server.load_model`` refuses it before
    sending (below)."""
    (tmp_path / "repo").mkdir()
    outside = tmp_path / "outside"
    shutil.copytree(REPOSITORIES[0] / "rel_double", outside)
    config = outside / "config.pbtxt"
    config.write_text(re.sub(r"^name:.*\n", "", config.read_text(), flags=re.M))  # named by its folder
    with TritonServer([tmp_path / "repo"], models=[]) as server:
        client = server.grpc_client
        try:
            client.load_model("../outside", headers=server.grpc_admin_headers)
            loaded = client.is_model_ready("../outside")
        except InferenceServerException as exc:
            loaded = exc.message()
        assert loaded is True, f"UPSTREAM FIXED? the load of '../outside' answered {loaded!r}: keep the refusal"
        for name in ("../outside", "..", "a/b", "x" * 256):
            with pytest.raises(ModelLoadError, match="refused before sending: a model name is one folder"):
                server.load_model(name)


def test_grpc_unload_without_the_key_is_refused(rel_server):
    with pytest.raises(InferenceServerException, match="restricted"):
        rel_server.grpc_client.unload_model("rel_double")
    assert rel_server.grpc_client.is_model_ready("rel_double")


def test_key_is_per_server_and_never_in_logs_or_reprs(rel_server):
    key = rel_server.admin_key
    assert len(key) >= 24
    assert TritonServer(REPOSITORIES).admin_key != key  # generated per server
    raw_log = rel_server.log_path.read_text(errors="replace")
    assert raw_log and key not in raw_log
    assert key not in rel_server.log_text()
    assert key not in repr(rel_server) and key not in repr(rel_server.options) and key not in str(rel_server.options)


def test_cli_serve_prints_no_key(tmp_path):
    """``lab-backends serve``: neither its output nor its log shows the key of the server it runs."""
    cli = [sys.executable, "-m", "lab_backends.cli", "serve", "--model-repository", str(REPOSITORIES[0]),
           "--model", "rel_double", "--startup-timeout", "120"]
    proc = subprocess.Popen(cli, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops" in line:  # the banner's last line, whatever the lines above it say
                break
        banner = "".join(lines)
        pid = int(re.search(r"pid (\d+)", banner).group(1))
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        key = next(a.rsplit("admin-key=", 1)[1] for a in args if "admin-key=" in a)
        log = Path(re.search(r"log\s+: (\S+)", banner).group(1))
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = banner + rest
    assert proc.returncode in (0, 128 + signal.SIGTERM), output  # a clean stop either way
    assert len(key) >= 24 and key not in output
    assert key not in log.read_text(errors="replace")
    assert not alive(pid)


# ---------------------------------------------------------------------------- JupyterLab
def test_jupyterlab_needs_its_token_and_listens_on_localhost(tmp_path):
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if k != "LAB_TOKEN"}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")  # no shared runtime files between runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab_backends.cli", "lab", "--port", str(port)],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        token = re.search(r"token=([0-9a-f]+)", first).group(1)
        assert len(token) >= 32
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                status, _, _ = _request(f"{base}/api/status", headers={"Authorization": f"token {token}"})
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "JupyterLab did not come up"
            time.sleep(0.5)

        status, _, _ = _request(f"{base}/api/contents")
        assert status == 403
        status, _, location = _request(f"{base}/lab")
        print(f"\nJupyterLab /lab without a token: {status} {location}")
        assert status in (302, 403) and (status == 403 or "login" in location)
        status, _, _ = _request(f"{base}/api/contents", headers={"Authorization": "token " + "0" * 32})
        assert status == 403
        status, body, _ = _request(f"{base}/api/contents", headers={"Authorization": f"token {token}"})
        assert status == 200 and json.loads(body)["type"] == "directory"
        status, _, _ = _request(f"{base}/api/contents?token={token}")
        assert status == 200

        cmdlines = _cmdlines(group_members(proc.pid))
        assert not any(token in c for c in cmdlines), "the token must not be readable from ps"
        sockets = _listening(group_members(proc.pid))
        assert any(port == p for _, _, p in sockets)
        assert [s for s in sockets if not _is_loopback_v4(s[1])] == []
    finally:
        members = group_members(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # what a process manager or `kill PID` sends the CLI
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 6
        while any(alive(p) for p in members) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in members if alive(p)]
        if left or proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: only what this test started
            proc.wait()
    assert not left, f"JupyterLab {left} outlived the CLI after SIGTERM (stopped here by its process group)"


# ---------------------------------------------------------------------------- repository
SECRET_PATTERNS = {
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "Jupyter URL token": re.compile(r"[?&]token=[0-9a-f]{32,}"),
    "assigned secret": re.compile(
        r"(?i)\b(?:api[_-]?key|secret|passw(?:or)?d|token|admin[_-]?key)\b\s*[:=]\s*['\"][A-Za-z0-9+/_\-]{16,}['\"]"
    ),
}


def _secret_hits(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        try:
            if path.stat().st_size > 2_000_000:
                continue
            text = path.read_text(errors="ignore")
        except (OSError, IsADirectoryError):
            continue
        for kind, pattern in SECRET_PATTERNS.items():
            for match in pattern.finditer(text):
                hits.append(f"{path}: {kind}: {match.group(0)[:40]}")
    return hits


def test_secret_scan_finds_a_planted_secret(tmp_path):
    planted = tmp_path / "settings.py"
    fake = "AKIA" + "ABCDEFGHIJKLMNOP"
    planted.write_text(f'aws = "{fake}"\nadmin_key = "{"q" * 24}"\n')
    assert len(_secret_hits([planted])) == 2


def test_no_secrets_in_the_repository():
    """Tracked files and new files git would pick up (what a clean clone would contain)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=PROJECT_ROOT, capture_output=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout here ({exc}); the scan needs the list of tracked files")
    paths = [PROJECT_ROOT / p for p in listed.decode().split("\0") if p]
    assert len(paths) > 10
    assert _secret_hits(paths) == []
