"""``TritonServer``: one way to get a real Triton, whether we start it or it already runs.

Three targets sit behind the same interface:

* ``local`` (default): the ``tritonserver`` shipped in the ``nvidia-pytriton`` wheel, started as a
  child process on free ports of 127.0.0.1, with a watchdog so it never outlives its owner;
* ``remote``: an existing server at ``TRITON_URL`` (e.g. the GPU Triton from docker-compose);
  nothing is started or stopped;
* ``docker``: the NGC image through the Docker SDK (see :mod:`lab_backends.server.docker`).

Usage::

    with TritonServer(models=["cost_model"]) as server:
        server.grpc_client.infer(...)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from lab_backends.server import bundle as _bundle
from lab_backends.server import crash as _crash  # issue-20 hook: crash detection/restart
from lab_backends.server import limits as _limits  # issue-20 hook: fd limit + parent death
from lab_backends.server import loading as _loading  # issue-20 hook: loads that cannot hang
from lab_backends.server import runs as _runs  # issue-20 hook: prune build/runs/
from lab_backends import rest
from lab_backends.errors import (
    LabBackendsError,
    ModelLoadError,
    PortInUseError,
    RemoteServerError,
    ServerExitedError,
    ServerStartupTimeoutError,
)
from lab_backends.server.options import ServerOptions
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY, PROJECT_ROOT, RUNS_DIR
from lab_backends.server.ports import LOCALHOST, free_ports, port_is_free
from lab_backends.server.processes import stop_group
from lab_backends.server.repository import config_problem, model_dirs, preflight
from lab_backends.waiting import poll

TARGETS = ("local", "remote", "docker")
_BIND_FAILURE = re.compile(r"(?i)(address already in use|failed to (start|bind)|Socket '.*' already in use)")
_PORT_RETRIES = 3
#: "E1130 04:42:34.387511 2147 model_repository_manager.cc:1460] \"" before Triton's own words.
_LOG_PREFIX = re.compile(r'^[IEW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "?')


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "<admin-key>") if secret else text


def _http_get(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    return rest.request(url, "GET", headers=headers, timeout=timeout)


def _http_post(url: str, body: bytes, headers: dict[str, str], timeout: float = 10.0) -> tuple[int, bytes]:
    return rest.request(url, "POST", body, headers, timeout)


class TritonServer:
    """A real Triton server: started here (``local``/``docker``) or found (``remote``).

    Parameters worth knowing (the rest are :class:`~lab_backends.server.options.ServerOptions` fields):

    * ``model_repository``: a folder or a list of folders (default: this project's repository);
    * ``models``: load only these (much faster than all: eight torch models take ~23 s);
    * ``http_port``/``grpc_port``/``metrics_port``: fixed ports; by default free ones are picked;
    * ``allow_broken_models``: keep the server up when a model fails to load and report it in
      :attr:`broken_models`, instead of raising :class:`ModelLoadError`;
    * ``startup_timeout_s``: the deadline for readiness; past it the server is stopped and
      :class:`ServerStartupTimeoutError` says what the log showed.
    """

    def __init__(
        self,
        model_repository: str | Path | Sequence[str | Path] | None = None,
        *,
        models: Sequence[str] | None = None,
        target: str | None = None,
        url: str | None = None,
        grpc_url: str | None = None,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        allow_broken_models: bool = False,
        startup_timeout_s: float = 120.0,
        run_dir: str | Path | None = None,
        backend_dir: str | Path | None = None,
        **options: Any,
    ) -> None:
        if target is None:
            target = "remote" if (url or os.environ.get("TRITON_URL")) else "local"
        if target not in TARGETS:
            raise LabBackendsError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
        self.target = target
        if model_repository is None:
            repos = [MODEL_REPOSITORY]
        elif isinstance(model_repository, (str, Path)):
            repos = [Path(model_repository)]
        else:
            repos = [Path(p) for p in model_repository]
        if target == "remote" and "admin_key" not in options and os.environ.get("TRITON_ADMIN_KEY"):
            options["admin_key"] = os.environ["TRITON_ADMIN_KEY"]
        self.options = ServerOptions(model_repositories=[p.resolve() for p in repos], models=models, **options)
        self.allow_broken_models = allow_broken_models
        self.startup_timeout_s = startup_timeout_s
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self._remote_http = url or os.environ.get("TRITON_URL")
        self._remote_grpc = grpc_url or os.environ.get("TRITON_GRPC_URL")
        self.backend_dir = Path(backend_dir) if backend_dir else BACKEND_DIR
        self._run_dir_arg = Path(run_dir) if run_dir else None
        self.run_dir: Path | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.host = LOCALHOST
        self.broken_models: dict[str, str] = {}
        self._preflight: dict[str, str] = {}
        self.process: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._container = None
        self._http_client = None
        self._grpc_client = None
        self._finalizer: weakref.finalize | None = None

    # ------------------------------------------------------------------ endpoints
    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP/REST endpoint, as ``tritonclient.http`` expects it."""
        if self.target == "remote":
            return self._strip_scheme(self._remote_http or "")
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` expects it."""
        if self.target == "remote":
            if self._remote_grpc:
                return self._strip_scheme(self._remote_grpc)
            host, _, port = self.http_url.rpartition(":")
            return f"{host}:{int(port) + 1}"  # Triton's default layout: 8000 HTTP, 8001 gRPC
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics page."""
        if self.target == "remote":
            metrics = os.environ.get("TRITON_METRICS_URL")
            if metrics:
                return metrics
            host, _, port = self.http_url.rpartition(":")
            return f"http://{host}:{int(port) + 2}/metrics"
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path | None:
        return self.run_dir / "tritonserver.log" if self.run_dir else None

    @property
    def trace_file(self) -> Path | None:
        """Where the server writes traces; for ``remote``, ``TRITON_TRACE_FILE`` as the lab sees it."""
        if self.target == "remote" and self.options.trace_file is None and os.environ.get("TRITON_TRACE_FILE"):
            return Path(os.environ["TRITON_TRACE_FILE"])
        return self.options.trace_file

    @property
    def admin_key(self) -> str:
        return self.options.admin_key

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that open the restricted admin APIs (model repository, stats, trace...)."""
        return self.options.admin_headers

    @property
    def grpc_admin_headers(self) -> dict[str, str]:
        """The same key as gRPC metadata (``triton-grpc-protocol-admin-key``)."""
        return self.options.grpc_admin_headers

    @property
    def http_client(self):
        """A ready ``tritonclient.http.InferenceServerClient`` (one thread at a time: it is gevent-based)."""
        _crash.raise_if_crashed(self)  # issue-20 hook: ServerCrashed on the next call after a crash
        if self._http_client is None:
            import tritonclient.http as httpclient

            self._http_client = httpclient.InferenceServerClient(self.http_url, network_timeout=120.0)
        return self._http_client

    @property
    def grpc_client(self):
        """A ready ``tritonclient.grpc.InferenceServerClient``."""
        _crash.raise_if_crashed(self)  # issue-20 hook
        if self._grpc_client is None:
            import tritonclient.grpc as grpcclient

            self._grpc_client = grpcclient.InferenceServerClient(self.grpc_url)
        return self._grpc_client

    @staticmethod
    def _strip_scheme(url: str) -> str:
        return re.sub(r"^\w+://", "", url).rstrip("/")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<TritonServer {self.target} http={self.http_url} grpc={self.grpc_url} {state}>"

    def is_running(self) -> bool:
        if self.target == "local":
            return self.process is not None and self.process.poll() is None
        if self.target == "docker":
            return self._container is not None and self._exit_code() is None
        return self.is_ready()

    def is_ready(self) -> bool:
        try:
            return _http_get(f"http://{self.http_url}/v2/health/ready", timeout=2.0)[0] == 200
        except OSError:
            return False

    def start(self) -> "TritonServer":
        """Start (or, for ``remote``, check) the server; returns once it is ready and models are checked."""
        if self.is_running() and self.target != "remote":
            return self
        if self.target == "remote":
            self._check_remote()
        elif self.target == "docker":
            from lab_backends.server.docker import start_container

            self._pick_ports()
            self._container = start_container(self)
            self._await_ready(deadline=time.monotonic() + self.startup_timeout_s)
            self._check_models()
        else:
            self._start_local()
        return self

    def restart(self) -> "TritonServer":
        """Start again after a crash (or any time): same models, same ports (issue-20 hook)."""
        return _crash.restart(self)

    def stop(self) -> None:
        """Stop what we started, by PID, and wait for it: server, stubs, watchdog, shm files."""
        self._close_clients()
        if self.target == "docker" and self._container is not None:
            from lab_backends.server.docker import stop_container

            stop_container(self._container, self.options.exit_timeout_s)
            self._container = None
        if self._finalizer is not None:
            self._finalizer()  # runs _terminate once, then detaches
            self._finalizer = None
        self.process = None
        self._watchdog = None

    def _close_clients(self) -> None:
        for client in (self._http_client, self._grpc_client):
            try:
                if client is not None:
                    client.close()
            except Exception:  # noqa: BLE001 - closing a client must never mask the real error
                pass
        self._http_client = self._grpc_client = None

    # ------------------------------------------------------------------ local target
    def _pick_ports(self) -> None:
        wanted = self._requested_ports
        for port in (p for p in wanted if p):
            if not port_is_free(port):
                raise PortInUseError(
                    f"port {port} on {LOCALHOST} is already in use; pass another port or leave it "
                    "out and a free one is picked"
                )
        free = iter(free_ports(3))
        self.http_port, self.grpc_port, self.metrics_port = (p or next(free) for p in wanted)

    def _start_local(self) -> None:
        bundle = _bundle.find_bundle()
        _bundle.check_model_environment()
        backend_dir = _bundle.prepare_backend_dir(bundle, self.backend_dir)
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        _runs.prune(RUNS_DIR)  # issue-20 hook: build/runs/ stays bounded
        if self._run_dir_arg:
            self.run_dir = self._run_dir_arg
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            import tempfile

            self.run_dir = Path(tempfile.mkdtemp(prefix="triton-", dir=RUNS_DIR))
        env = _bundle.server_environment(bundle)
        # Models that would hang Triton's load (no model.py: it stays LOADING forever) are left
        # out of --load-model and reported as broken, instead of costing the whole deadline.
        self._preflight = preflight(self.options.model_repositories, self.options.models)
        options = self.options
        if self._preflight:
            wanted = self.options.models or sorted(model_dirs(self.options.model_repositories))
            options = replace(self.options, models=[m for m in wanted if m not in self._preflight])
        deadline = time.monotonic() + self.startup_timeout_s
        for attempt in range(_PORT_RETRIES):
            self._pick_ports()
            args = options.args(
                self.http_port, self.grpc_port, self.metrics_port, backend_dir, cache_dir=bundle.caches
            )
            log = open(self.log_path, "ab")
            try:
                self.process = subprocess.Popen(
                    [str(bundle.binary), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.run_dir,
                    start_new_session=True,  # its own process group: server + stubs stop together
                    preexec_fn=_limits.child_setup(),  # issue-20 hook: soft fd limit = hard; dies with us
                )
            finally:
                log.close()
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "lab_backends.server.watchdog", str(os.getpid()), str(self.process.pid),
                 str(self.options.exit_timeout_s + 5), str(self.log_path)],  # issue-20: log path -> log cap
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=str(PROJECT_ROOT),
                start_new_session=True,
            )
            self._finalizer = weakref.finalize(
                self, _terminate, self.process, self._watchdog, self.options.exit_timeout_s + 5
            )
            try:
                self._await_ready(deadline)
                break
            except ServerExitedError as exc:
                retry = self._requested_ports == (None, None, None) and _BIND_FAILURE.search(exc.log_tail)
                self.stop()
                if not retry or attempt == _PORT_RETRIES - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        try:
            self._check_models()
        except BaseException:
            self.stop()
            raise

    def _exit_code(self) -> int | None:
        """The server's exit code if it has exited (local process or container), else ``None``."""
        if self.process is not None:
            return self.process.poll()
        if self._container is not None:
            try:
                self._container.reload()
                if self._container.status in ("exited", "dead"):
                    return int(self._container.attrs.get("State", {}).get("ExitCode", -1))
            except Exception:  # noqa: BLE001 - the container is gone: it has exited
                return -1
        return None

    def log_text(self) -> str:
        """The server log so far (the admin key redacted)."""
        if not self.log_path or not self.log_path.exists():
            return ""
        return _redact(self.log_path.read_text(errors="replace"), self.admin_key)

    def _log_tail(self, lines: int = 25) -> str:
        noise = ("CudaDriverHelper", "NVML", "DCGM", "pinned memory", "unable to create stream")
        kept = [ln for ln in self.log_text().splitlines() if not any(n in ln for n in noise)]
        return "\n".join(kept[-lines:])

    def _await_ready(self, deadline: float) -> None:
        """Poll readiness until the deadline; fail fast if the process exits."""
        url = f"http://{self.http_url}/v2/health/ready"
        while True:
            exit_code = self._exit_code()
            if exit_code is not None:
                raise ServerExitedError.with_log(
                    f"tritonserver exited with code {exit_code} before it was ready (log: {self.log_path})",
                    self._log_tail(),
                )
            try:
                if _http_get(url, timeout=1.0)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                tail = self._log_tail()
                loading = re.findall(r'"loading: ([^:"]+):', tail)
                hint = ""
                if loading:
                    hint = (
                        f" It was still loading {', '.join(sorted(set(loading)))}: a model that imports a "
                        "heavy framework may need a longer startup_timeout_s, and a Python stub that cannot "
                        "find its libraries hangs here with no error (check LD_LIBRARY_PATH)."
                    )
                raise ServerStartupTimeoutError(
                    f"tritonserver was not ready within {self.startup_timeout_s:.0f} s and was stopped.{hint}\n"
                    f"last log lines ({self.log_path}):\n{tail}"
                )
            time.sleep(0.1)

    # ------------------------------------------------------------------ models
    def repository_index(self) -> list[dict]:
        """Every model the server knows of, with ``state`` and, for a broken one, ``reason``."""
        status, body = _http_post(
            f"http://{self.http_url}/v2/repository/index",
            b"{}",
            {"Content-Type": "application/json", **self.admin_headers},
        )
        if status != 200:
            raise RemoteServerError(f"repository index failed with HTTP {status}: {body.decode(errors='replace')}")
        return json.loads(body)

    def _reason_from_log(self, model: str) -> str:
        lines = self.log_text().splitlines()
        hits = [ln for ln in lines if f"'{model}'" in ln and ("fail" in ln.lower() or "error" in ln.lower())]
        # Triton logs a config parse error on the line *before* its "Poll failed for 'm'" line.
        for i, line in enumerate(lines):
            if "Error parsing text-format" in line and i + 1 < len(lines) and f"'{model}'" in "".join(lines[i + 1 : i + 3]):
                hits.insert(0, line)
        return "\n".join(_LOG_PREFIX.sub("", h).rstrip('"') for h in hits[-3:])

    def _check_models(self) -> None:
        """After readiness: is every model we asked for READY? Quote Triton's reason if not."""
        index = {entry["name"]: entry for entry in self.repository_index()}
        on_disk = model_dirs(self.options.model_repositories)
        wanted = list(self.options.models) if self.options.models is not None else sorted(on_disk)
        self.broken_models = {}
        for name in wanted:
            entry = index.get(name)
            if entry and entry.get("state") == "READY":
                continue
            if name in self._preflight:
                reason = self._preflight[name]
            elif name not in on_disk and entry is None:
                reason = (
                    f"there is no folder '{name}' with a config.pbtxt in "
                    f"{', '.join(map(str, self.options.model_repositories))}; models there: {', '.join(sorted(on_disk))}"
                )
            else:
                reason = (entry or {}).get("reason") or self._reason_from_log(name) or "see the server log"
                detail = config_problem(on_disk[name]) if name in on_disk else None
                if detail and detail not in reason:
                    reason += f"\n  {detail}"
                if "backend" in reason and ("unable to find" in reason or "not found" in reason.lower()):
                    reason += (
                        f"\n  the backend library is not in {self.backend_dir}: run `lab-backends setup` "
                        "(or `make lab`), which builds the C backends"
                    )
            self.broken_models[name] = reason
        if self.broken_models and not self.allow_broken_models:
            name, reason = next(iter(self.broken_models.items()))
            raise ModelLoadError(
                name, reason, hint=f"fix the model folder, or pass allow_broken_models=True (log: {self.log_path})"
            )

    def _check_remote(self) -> None:
        if not self._remote_http:
            raise RemoteServerError("target 'remote' needs url=... or the TRITON_URL environment variable")
        if not poll(self.is_ready, bool, self.startup_timeout_s, 0.5):
            raise RemoteServerError(
                f"no ready Triton at {self.http_url} within {self.startup_timeout_s:.0f} s; start it "
                "(e.g. `docker compose up triton`) or unset TRITON_URL to use the embedded server"
            )
        self.http_port = int(self.http_url.rpartition(":")[2])
        self.grpc_port = int(self.grpc_url.rpartition(":")[2])

    def load_model(self, name: str, config: Any = None, files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model through the restricted model-repository API.

        ``config`` may be a ``ModelConfig`` protobuf, a dict or a JSON string. Triton *replaces* the
        whole config with it, so derive overrides from :meth:`model_config` rather than writing a
        partial one. Without ``config``, a model loaded with an override keeps it unless its files
        changed on disk: unload it first to go back to ``config.pbtxt``.
        """
        from lab_backends.server.repository import ModelConfig, config_json

        from tritonclient.utils import InferenceServerException

        if isinstance(config, ModelConfig):
            config = config_json(config)
        elif isinstance(config, dict):
            config = json.dumps(config)
        log_before = len(self.log_text())
        try:
            _loading.load(self, name, config, files)  # issue-20 hook: preflight + deadline (load_timeout_s)
        except InferenceServerException as exc:
            # The API answers e.g. "failed to poll from model repository"; the log says why.
            new_lines = self.log_text()[log_before:].splitlines()
            hits = [ln for ln in new_lines if f"'{name}'" in ln and ("fail" in ln.lower() or "error" in ln.lower())]
            reason = _LOG_PREFIX.sub("", hits[-1]).rstrip('"') if hits else ""
            raise ModelLoadError(name, reason or exc.message() or str(exc)) from exc

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.http_client.unload_model(name, headers=self.admin_headers, unload_dependents=unload_dependents)

    def model_config(self, name: str):
        """The config the server is using for ``name``, as a ``ModelConfig`` protobuf."""
        from lab_backends.server.repository import config_from_json

        return config_from_json(self.http_client.get_model_config(name))

    def statistics(self, name: str = "") -> dict:
        """The statistics API (restricted: the admin key is sent for you)."""
        return self.http_client.get_inference_statistics(name, headers=self.admin_headers)


def _terminate(process: subprocess.Popen, watchdog: subprocess.Popen | None, grace_s: float) -> None:
    """Stop a local server and its group; then the watchdog. Runs once (``weakref.finalize``)."""
    try:
        stop_group(process.pid, grace_s, reap=process.poll)
        process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - best effort at interpreter exit; the watchdog is the backstop
        pass
    if watchdog is not None and watchdog.poll() is None:
        watchdog.terminate()
        try:
            watchdog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            watchdog.kill()
