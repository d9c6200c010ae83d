"""The GPU route's files: docker-compose.yml, the Dockerfiles, environment-gpu.yml, the docs' tag.

No Docker engine runs here, so the compose file is checked the way the engine would read it: the
compose-spec JSON schema (check-jsonschema's vendored copy, no network), then what the notebooks
rely on: 127.0.0.1-only ports, the options a local TritonServer passes, the admin key from the
environment, a trace volume the lab can read, GPUs reserved, and one NGC tag everywhere.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.docker import LAB_TRITON_IMAGE, NGC_TRITON_IMAGE
from lab_backends.server.options import RESTRICTED_APIS, ServerOptions
from lab_backends.server.triton_server import TritonServer

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
NGC_PATTERN = re.compile(r"nvcr\.io/nvidia/tritonserver:[0-9][0-9.]*-py3")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _flags(command: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for arg in command:
        name, _, value = arg.partition("=")
        found.setdefault(name, []).append(value)
    return found


def test_compose_validates_against_the_compose_spec() -> None:
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_ngc_tag_everywhere(compose: dict) -> None:
    assert compose["x-ngc-image"] == NGC_TRITON_IMAGE
    triton = compose["services"]["triton"]
    assert triton["build"]["args"]["TRITON_IMAGE"] == NGC_TRITON_IMAGE
    assert triton["image"] == LAB_TRITON_IMAGE
    # Every NGC tag written anywhere in the compose file and the Dockerfile is the same one.
    for path in (COMPOSE, PROJECT_ROOT / triton["build"]["dockerfile"]):
        assert set(NGC_PATTERN.findall(path.read_text())) == {NGC_TRITON_IMAGE}, path


def test_docs_cite_the_same_tag() -> None:
    guide = PROJECT_ROOT / "docs" / "gpu.md"
    assert set(NGC_PATTERN.findall(guide.read_text())) == {NGC_TRITON_IMAGE}
    readme = (PROJECT_ROOT / "README.md").read_text() if (PROJECT_ROOT / "README.md").exists() else ""
    if "GPU quick start" not in readme:
        pytest.skip("README.md has no 'GPU quick start' section yet")
    assert set(NGC_PATTERN.findall(readme)) == {NGC_TRITON_IMAGE}, "README must cite NGC_TRITON_IMAGE"


def test_every_published_port_is_on_localhost(compose: dict) -> None:
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items()}
    assert published["triton"] and published["lab"]
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
    assert {p.split(":")[1] for p in published["triton"]} == {"8000", "8001", "8002"}


def test_triton_command_carries_what_the_notebooks_need(compose: dict) -> None:
    triton = compose["services"]["triton"]
    command = triton["command"]
    assert command[0] == "tritonserver"
    flags = _flags(command[1:])
    # Every option a local TritonServer with trace, cache and summary latencies passes, except
    # the addresses and ports (the container's defaults, published on 127.0.0.1 above).
    local = ServerOptions(
        model_repositories=[PROJECT_ROOT / "model_repository"],
        trace_file=Path("/traces/trace.json"),
        cache_size=1 << 20,
        metrics_config={"summary_latencies": "true"},
    ).args(8000, 8001, 8002, "/opt/tritonserver/backends")
    wanted = set(_flags(local)) - {"--http-address", "--grpc-address", "--metrics-address", "--http-port",
                                    "--grpc-port", "--metrics-port", "--log-verbose"}
    assert wanted - set(flags) == set()
    assert flags["--model-control-mode"] == ["explicit"] and flags["--load-model"] == ["*"]
    assert flags["--model-repository"] == ["/models/model_repository", "/models/model_repository_gpu"]
    assert "triton,file=/traces/trace.json" in flags["--trace-config"]
    assert flags["--metrics-config"] == ["summary_latencies=true"]
    # Admin APIs restricted with a key that must come from the environment (no default value).
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        (spec,) = flags[flag]
        apis, _, key = spec.partition(":admin-key=")
        assert apis.split(",") == list(RESTRICTED_APIS)
        assert re.fullmatch(r"\$\{TRITON_ADMIN_KEY:\?[^}]*\}", key), key


def test_triton_mounts_gpus_and_health(compose: dict) -> None:
    triton = compose["services"]["triton"]
    volumes = triton["volumes"]
    assert "./model_repository:/models/model_repository:ro" in volumes
    assert "./model_repository_gpu:/models/model_repository_gpu:ro" in volumes
    assert "traces:/traces" in volumes and "traces" in compose["volumes"]
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    health = triton["healthcheck"]
    assert any("/v2/health/ready" in part for part in health["test"])
    assert triton["shm_size"]


def test_lab_points_at_triton(compose: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = compose["services"]["lab"]
    env = lab["environment"]
    assert env["TRITON_ADMIN_KEY"].startswith("${TRITON_ADMIN_KEY:?")
    assert "traces:/traces:ro" in lab["volumes"]
    assert lab["depends_on"]["triton"]["condition"] == "service_healthy"
    assert lab["build"]["dockerfile"] == "docker/lab.Dockerfile"
    assert "environment.yml" in (PROJECT_ROOT / lab["build"]["dockerfile"]).read_text()
    # What the `remote` target makes of that environment (nothing is contacted here).
    for key in ("TRITON_URL", "TRITON_GRPC_URL", "TRITON_METRICS_URL"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("TRITON_ADMIN_KEY", "from-compose")
    server = TritonServer()
    assert server.target == "remote"
    assert (server.http_url, server.grpc_url) == ("triton:8000", "triton:8001")
    assert server.metrics_url == "http://triton:8002/metrics"
    assert server.admin_headers == {"admin-key": "from-compose"}


def _pip_list(path: Path) -> list[str]:
    deps = yaml.safe_load(path.read_text())["dependencies"]
    return next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)


def test_gpu_environment_swaps_onnxruntime_and_nothing_else() -> None:
    cpu = _pip_list(PROJECT_ROOT / "environment.yml")
    gpu = _pip_list(PROJECT_ROOT / "environment-gpu.yml")
    names = [re.split(r"[<>=\[ ]", req)[0] for req in gpu]
    assert "onnxruntime-gpu" in names and "onnxruntime" not in names, "never both: same import name"
    assert gpu == ["onnxruntime-gpu" if req == "onnxruntime" else req for req in cpu]
    assert any(req.startswith("torch==") for req in gpu)
    cpu_conda = [d for d in yaml.safe_load((PROJECT_ROOT / "environment.yml").read_text())["dependencies"]
                 if not isinstance(d, dict)]
    gpu_conda = [d for d in yaml.safe_load((PROJECT_ROOT / "environment-gpu.yml").read_text())["dependencies"]
                 if not isinstance(d, dict)]
    assert cpu_conda == gpu_conda


def test_triton_image_requirements_pin_numpy_below_2() -> None:
    reqs = [ln.strip() for ln in (PROJECT_ROOT / "docker" / "triton-requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert "numpy<2" in reqs
    assert "onnxruntime-gpu" in reqs and "onnxruntime" not in reqs
