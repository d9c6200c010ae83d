"""The ``docker`` target: the full NGC Triton in a container, driven through the Docker SDK.

``TritonServer(target="docker")`` calls :func:`start_container` and :func:`stop_container`; the
rest of the interface (ports, readiness, model checks, admin key) is shared with the embedded
server, so a notebook does not care which one it got.

Why a *derived* image rather than the bare NGC one: the NGC image runs ``model.py`` with its own
system Python, which has neither ``torch`` nor ``onnxruntime``, and whose numpy must be pinned
below 2 (numpy 2 silently corrupted inputs in this Triton generation). ``docker/triton.Dockerfile``
starts ``FROM`` :data:`NGC_TRITON_IMAGE`, ``pip install``s ``docker/triton-requirements.txt`` into
that system Python and compiles the C backends in ``c_backends/`` against the image's own
``libtritonserver.so``. It is built once (by ``docker compose build`` or, here, on first use) and
then cached by the engine, so a start costs no download. The alternatives were worse:
``EXECUTION_ENV_PATH`` needs a conda-pack archive per model config, and a ``pip install`` in an
entrypoint repeats a multi-GB download at every start and needs internet at run time.

The container listens on all of *its* interfaces (it must, for Docker to forward to it), while the
host side of each published port is bound to 127.0.0.1 only.

Deferred import: the Docker SDK (~0.1 s), only when this target starts a container: every
``TritonServer`` (and ``lab-backends --help``) imports this module, most never use Docker.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lab_backends.errors import DockerUnavailableError, ServerExitedError
from lab_backends.paths import PROJECT_ROOT, RUNS_DIR
from lab_backends.server.logs import ServerLog
from lab_backends.server.options import ServerOptions
from lab_backends.server.readiness import await_ready
from lab_backends.server.target import Ports, Target

#: The one pinned NGC tag (Triton 2.51 = release 24.10, the version the embedded wheel carries).
#: docker-compose.yml, docker/triton.Dockerfile, README.md and docs/gpu.md cite the same string
#: (tests/test_compose.py checks it).
NGC_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"

#: Our image derived from it (model-code dependencies + C backends); the tag follows the NGC tag.
LAB_TRITON_IMAGE = "lab-backends-triton:" + NGC_TRITON_IMAGE.rpartition(":")[2]
TRITON_DOCKERFILE = "docker/triton.Dockerfile"

#: Paths inside the container.
CONTAINER_BACKEND_DIR = "/opt/tritonserver/backends"
CONTAINER_MODELS_ROOT = "/models"
CONTAINER_TRACE_DIR = "/traces"
#: Triton's default ports inside the container; the host ports are the ones TritonServer picked.
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
LABEL = "org.lab-backends.server"


def gpus_available(client: Any = None) -> bool:
    """Whether the container should ask for GPUs: an NVIDIA driver here, or the nvidia runtime in the engine.

    ``nvidia-smi`` on ``PATH`` means a driver on this host; ``docker info`` listing an ``nvidia``
    runtime means the engine can hand GPUs to containers (e.g. a remote engine via DOCKER_HOST).
    ``LAB_DOCKER_GPUS=0``/``1`` overrides both.
    """
    forced = os.environ.get("LAB_DOCKER_GPUS")
    if forced in ("0", "1"):
        return forced == "1"
    if shutil.which("nvidia-smi"):
        return True
    if client is not None:
        try:
            return "nvidia" in (client.info().get("Runtimes") or {})
        except Exception:  # noqa: BLE001 - an engine that cannot answer simply gets no GPUs
            return False
    return False


def _container_repositories(repositories: list[Path]) -> list[tuple[Path, str]]:
    """(host path, container path) for each repository: ``/models/<folder name>``, made unique."""
    pairs: list[tuple[Path, str]] = []
    used: set[str] = set()
    for index, repo in enumerate(repositories):
        name = repo.name or f"repo{index}"
        if name in used:
            name = f"{name}-{index}"
        used.add(name)
        pairs.append((repo, f"{CONTAINER_MODELS_ROOT}/{name}"))
    return pairs


def container_spec(server: Any, gpus: bool | None = None) -> dict[str, Any]:
    """Keyword arguments for ``docker.from_env().containers.run`` that start ``server`` in a container.

    ``server`` is a :class:`~lab_backends.server.triton_server.TritonServer` whose host ports are already picked.
    ``gpus=None`` detects them (:func:`gpus_available`); ``True``/``False`` forces the choice.
    The repositories are mounted read-only; a trace file, if asked for, gets its folder mounted
    read-write at ``/traces`` so the notebook on the host can read what the server writes.
    """
    from docker.types import DeviceRequest, Ulimit

    options = server.options
    repos = _container_repositories([Path(p) for p in options.model_repositories])
    volumes: dict[str, dict[str, str]] = {str(host): {"bind": inside, "mode": "ro"} for host, inside in repos}
    if options.trace_file is not None:
        trace = Path(options.trace_file).resolve()
        trace.parent.mkdir(parents=True, exist_ok=True)
        volumes[str(trace.parent)] = {"bind": CONTAINER_TRACE_DIR, "mode": "rw"}
        options = dataclasses.replace(options, trace_file=Path(CONTAINER_TRACE_DIR) / trace.name)
    command = ["tritonserver", *options.args(
        CONTAINER_PORTS["http"],
        CONTAINER_PORTS["grpc"],
        CONTAINER_PORTS["metrics"],
        CONTAINER_BACKEND_DIR,
        host="0.0.0.0",  # inside the container; the host side is 127.0.0.1 (ports below)
        repositories=[inside for _, inside in repos],
    )]
    if gpus is None:
        gpus = gpus_available()
    if gpus:
        command.append("--allow-gpu-metrics=true")
    host = server.host
    spec: dict[str, Any] = {
        "image": os.environ.get("LAB_TRITON_IMAGE", LAB_TRITON_IMAGE),
        "command": command,
        "ports": {
            f"{CONTAINER_PORTS['http']}/tcp": (host, server.http_port),
            f"{CONTAINER_PORTS['grpc']}/tcp": (host, server.grpc_port),
            f"{CONTAINER_PORTS['metrics']}/tcp": (host, server.metrics_port),
        },
        "volumes": volumes,
        "labels": {
            LABEL: "1",
            f"{LABEL}.owner-pid": str(os.getpid()),
            f"{LABEL}.base-image": NGC_TRITON_IMAGE,
        },
        "name": f"lab-backends-triton-{server.http_port}",
        "detach": True,
        # The Python backend moves tensors through /dev/shm: Docker's 64 MB default is too small.
        "shm_size": "1g",
        "ulimits": [Ulimit(name="memlock", soft=-1, hard=-1), Ulimit(name="stack", soft=67108864, hard=67108864)],
        "environment": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    }
    if gpus:
        spec["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return spec


def docker_client() -> Any:
    """A Docker SDK client that has answered a ping, or :class:`DockerUnavailableError` saying why not."""
    try:
        import docker
    except ImportError as exc:
        raise DockerUnavailableError(
            "the docker target needs the Docker SDK for Python: `pip install docker` "
            "(or use the embedded server: TritonServer() without target='docker')"
        ) from exc
    try:
        client = docker.from_env()
        client.ping()
        return client
    except Exception as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise DockerUnavailableError(
            f"no Docker engine answers at {where} ({type(exc).__name__}: {exc}). Start Docker (and, for "
            "GPUs, the NVIDIA Container Toolkit), or set DOCKER_HOST; without Docker use the embedded "
            "server (TritonServer() with no target) or an existing one via TRITON_URL (target='remote')"
        ) from exc


def ensure_image(client: Any, image: str) -> None:
    """Build :data:`LAB_TRITON_IMAGE` from ``docker/triton.Dockerfile`` if the engine does not have it yet."""
    import docker

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    if image != LAB_TRITON_IMAGE:
        raise DockerUnavailableError(
            f"image {image} (from LAB_TRITON_IMAGE) is not on this Docker engine; pull or build it first"
        )
    try:
        client.images.build(
            path=str(PROJECT_ROOT),
            dockerfile=TRITON_DOCKERFILE,
            tag=image,
            buildargs={"TRITON_IMAGE": NGC_TRITON_IMAGE},
            rm=True,
        )
    except docker.errors.BuildError as exc:
        tail = "".join(str(chunk.get("stream", chunk)) for chunk in list(exc.build_log)[-15:])
        raise DockerUnavailableError(
            f"building {image} from {TRITON_DOCKERFILE} failed: {exc}\n{tail}\n"
            "It needs internet access (the NGC base image and pip packages); see docs/gpu.md"
        ) from exc


def _follow_logs(container: Any, log_path: Path) -> None:
    """Copy the container's log into ``log_path`` so TritonServer can quote it like a local log."""
    try:
        with open(log_path, "ab") as log:
            for chunk in container.logs(stream=True, follow=True):
                log.write(chunk)
                log.flush()
    except Exception:  # noqa: BLE001 - the container went away: nothing more to copy
        pass


def start_container(server: Any, log_path: Path | None = None) -> Any:
    """Start ``server`` (ports picked) as a container; return the SDK's ``Container``.

    With ``log_path``, the container's log is streamed into it, so a model that fails to load is
    reported with Triton's own reason, as for the embedded server.
    """
    import docker

    client = docker_client()
    spec = container_spec(server, gpus=gpus_available(client))
    ensure_image(client, spec["image"])
    try:
        container = client.containers.run(**spec)
    except docker.errors.APIError as exc:
        hint = ""
        if "gpu" in str(exc).lower() or "nvidia" in str(exc).lower():
            hint = " For GPUs the engine needs the NVIDIA Container Toolkit; LAB_DOCKER_GPUS=0 runs on the CPU."
        raise DockerUnavailableError(
            f"the Docker engine refused to start {spec['name']} from {spec['image']}: {exc}.{hint}"
        ) from exc
    if log_path is not None:
        threading.Thread(target=_follow_logs, args=(container, log_path), daemon=True).start()
    time.sleep(0.2)
    container.reload()
    if container.status == "exited":
        logs = container.logs(tail=25).decode(errors="replace")
        stop_container(container, 0)
        raise ServerExitedError.with_log(f"container {spec['name']} exited at once", logs)
    return container


def stop_container(container: Any, timeout: float) -> None:
    """Stop (SIGTERM, then SIGKILL after ``timeout`` s) and remove the container; never raises."""
    try:
        container.stop(timeout=int(timeout) + 1)
    except Exception:  # noqa: BLE001 - already stopped or gone
        pass
    try:
        container.remove(force=True)
    except Exception:  # noqa: BLE001 - already removed
        pass


class DockerTarget(Target):
    """The NGC-derived image in a container on host ports of 127.0.0.1; its log is copied to a run folder."""

    name = "docker"

    def __init__(self, options: ServerOptions, requested_ports: Ports, startup_timeout_s: float) -> None:
        super().__init__()
        self.options = options
        self.requested_ports = requested_ports
        self.startup_timeout_s = startup_timeout_s
        self.container: Any = None

    def is_running(self) -> bool:
        return self.container is not None and self.exit_code() is None

    def exit_code(self) -> int | None:
        if self.container is None:
            return None
        try:
            self.container.reload()
            if self.container.status in ("exited", "dead"):
                return int(self.container.attrs.get("State", {}).get("ExitCode", -1))
        except Exception:  # noqa: BLE001 - the container is gone: it has exited
            return -1
        return None

    def start(self) -> bool:
        if self.is_running():
            return False
        deadline = time.monotonic() + self.startup_timeout_s
        self.pick_ports(self.requested_ports)
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(tempfile.mkdtemp(prefix="triton-docker-", dir=RUNS_DIR))
        try:
            self.container = start_container(self, self.log_path)
        except DockerUnavailableError:
            shutil.rmtree(self.run_dir, ignore_errors=True)  # nothing ran: leave nothing behind
            self.run_dir = None
            raise
        try:
            await_ready(self.http_url, self.exit_code, ServerLog(self.log_path, self.options.admin_key),
                        deadline, self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return True

    def stop(self) -> None:
        if self.container is not None:
            stop_container(self.container, self.options.exit_timeout_s)
            self.container = None
