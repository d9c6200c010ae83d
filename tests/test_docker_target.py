"""The ``docker`` target: how its container is specified (no Docker engine runs here).

What can be checked without an engine is checked against the real Docker SDK: the spec converts
into the engine's create-container payload (unknown or misspelled keywords fail there), ports are
bound to 127.0.0.1 only, repositories are read-only, GPUs are asked for exactly when present, and
the admin key reaches the server's command line. Starting the container must fail *clearly*.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab_backends.errors import DockerUnavailableError
from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server import docker as docker_target
from lab_backends.server.docker import (
    CONTAINER_BACKEND_DIR,
    LAB_TRITON_IMAGE,
    NGC_TRITON_IMAGE,
    container_spec,
    gpus_available,
    start_container,
)
from lab_backends.server.triton_server import TritonServer

PORTS = (18000, 18001, 18002)


@pytest.fixture
def server(tmp_path: Path) -> TritonServer:
    extra = tmp_path / "extra_models"
    extra.mkdir()
    srv = TritonServer(
        [MODEL_REPOSITORY, extra],
        target="docker",
        models=["cost_model"],
        trace_file=tmp_path / "traces" / "trace.json",
        cache_size=1 << 20,
    )
    srv.http_port, srv.grpc_port, srv.metrics_port = PORTS  # what _pick_ports would have chosen
    return srv


def _flag_values(command: list[str], flag: str) -> list[str]:
    return [arg.split("=", 1)[1] for arg in command if arg.startswith(flag + "=")]


def test_ngc_tag_is_pinned_and_derived_image_follows_it() -> None:
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", NGC_TRITON_IMAGE)
    assert NGC_TRITON_IMAGE.endswith(":24.10-py3"), "Triton 2.51 (the embedded wheel) is release 24.10"
    assert LAB_TRITON_IMAGE.endswith(":" + NGC_TRITON_IMAGE.rpartition(":")[2])
    dockerfile = (PROJECT_ROOT / docker_target.TRITON_DOCKERFILE).read_text()
    assert f"ARG TRITON_IMAGE={NGC_TRITON_IMAGE}\n" in dockerfile
    assert "FROM ${TRITON_IMAGE}" in dockerfile


def test_spec_binds_every_port_to_localhost(server: TritonServer) -> None:
    spec = container_spec(server, gpus=False)
    assert spec["ports"] == {
        "8000/tcp": ("127.0.0.1", PORTS[0]),
        "8001/tcp": ("127.0.0.1", PORTS[1]),
        "8002/tcp": ("127.0.0.1", PORTS[2]),
    }
    assert spec["detach"] is True
    assert spec["image"] == LAB_TRITON_IMAGE
    assert spec["labels"][docker_target.LABEL] == "1"
    assert spec["labels"][f"{docker_target.LABEL}.base-image"] == NGC_TRITON_IMAGE


def test_spec_mounts_repositories_read_only_and_the_trace_folder_writable(server: TritonServer) -> None:
    spec = container_spec(server, gpus=False)
    command = spec["command"]
    repos = _flag_values(command, "--model-repository")
    assert len(repos) == 2 and len(set(repos)) == 2
    by_bind = {v["bind"]: (host, v["mode"]) for host, v in spec["volumes"].items()}
    for inside in repos:
        host, mode = by_bind[inside]
        assert mode == "ro", f"{host} must be mounted read-only"
    assert by_bind[repos[0]][0] == str(MODEL_REPOSITORY.resolve())
    host, mode = by_bind[docker_target.CONTAINER_TRACE_DIR]
    assert mode == "rw" and host == str(server.options.trace_file.parent.resolve())
    assert Path(host).is_dir(), "the trace folder exists before the container writes into it"
    assert "--trace-config=triton,file=/traces/trace.json" in command


def test_spec_command_uses_container_paths_and_the_admin_key(server: TritonServer) -> None:
    command = container_spec(server, gpus=False)["command"]
    assert command[0] == "tritonserver"
    assert _flag_values(command, "--backend-directory") == [CONTAINER_BACKEND_DIR]
    assert _flag_values(command, "--http-port") == ["8000"]
    assert _flag_values(command, "--grpc-port") == ["8001"]
    assert _flag_values(command, "--metrics-port") == ["8002"]
    # Inside the container the server must listen on its own interfaces; the host side is 127.0.0.1.
    assert _flag_values(command, "--http-address") == ["0.0.0.0"]
    assert _flag_values(command, "--load-model") == ["cost_model"]
    assert "--model-control-mode=explicit" in command
    assert any(a.startswith("--cache-config=local,size=") for a in command)
    restricted = _flag_values(command, "--http-restricted-api")
    assert restricted and restricted[0].endswith(f":admin-key={server.admin_key}")
    assert _flag_values(command, "--grpc-restricted-protocol") == restricted
    # No host path leaks into the container's command line.
    assert not [a for a in command if str(PROJECT_ROOT) in a]


def test_gpu_device_request_only_when_gpus_are_present(server: TritonServer) -> None:
    with_gpu = container_spec(server, gpus=True)
    (request,) = with_gpu["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert "--allow-gpu-metrics=true" in with_gpu["command"]
    without = container_spec(server, gpus=False)
    assert "device_requests" not in without
    assert "--allow-gpu-metrics=true" not in without["command"]


def test_gpu_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    class Engine:  # stands in for `docker info`, not for Triton
        def __init__(self, runtimes: dict) -> None:
            self.runtimes = runtimes

        def info(self) -> dict:
            return {"Runtimes": self.runtimes}

    monkeypatch.delenv("LAB_DOCKER_GPUS", raising=False)
    monkeypatch.setattr(docker_target.shutil, "which", lambda name: None)
    assert gpus_available() is False
    assert gpus_available(Engine({"runc": {}})) is False
    assert gpus_available(Engine({"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}})) is True
    monkeypatch.setattr(docker_target.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert gpus_available() is True
    monkeypatch.setenv("LAB_DOCKER_GPUS", "0")
    assert gpus_available() is False


def test_spec_is_accepted_by_the_docker_sdk(server: TritonServer) -> None:
    """The SDK turns run() kwargs into the engine's payload; a wrong keyword raises TypeError here."""
    from docker.models.containers import _create_container_args

    for gpus in (False, True):
        spec = container_spec(server, gpus=gpus)
        spec.pop("detach")  # handled by run() itself, not part of the create payload
        payload = _create_container_args({**spec, "version": "1.43"})
        host_config = payload["host_config"]
        assert all(b[0]["HostIp"] == "127.0.0.1" for b in host_config["PortBindings"].values())
        assert all(bind.endswith(":ro") for bind in host_config["Binds"] if ":/models/" in bind)
        assert host_config["ShmSize"] == 1 << 30
        assert ("DeviceRequests" in host_config) is gpus


def test_start_container_without_an_engine_says_what_to_do(server: TritonServer, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(DockerUnavailableError, match=r"no Docker engine answers at unix://.*no-docker\.sock") as info:
        start_container(server)
    message = str(info.value)
    assert "Start Docker" in message and "TRITON_URL" in message
    # The same through TritonServer: nothing is left behind.
    with pytest.raises(DockerUnavailableError):
        server.start()
    assert server._target.container is None and not server.is_running()
