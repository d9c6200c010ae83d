"""``TritonServer``: one way to get a real Triton, whether we start it or it already runs.

A facade over one target (:class:`~lab_backends.server.target.Target`):

* ``local`` (default, :mod:`lab_backends.server.local`): the ``tritonserver`` shipped in the
  ``nvidia-pytriton`` wheel, a child process on free ports of 127.0.0.1, with a watchdog;
* ``remote`` (:mod:`lab_backends.server.remote`): an existing server at ``TRITON_URL`` (e.g. the
  GPU Triton from docker-compose); nothing is started or stopped;
* ``docker`` (:mod:`lab_backends.server.docker`): the NGC image through the Docker SDK.

The facade holds what does not depend on where the server runs: options, clients, the admin key,
the model-repository calls, and the check that every requested model is READY.

Usage::

    with TritonServer(models=["cost_model"]) as server:
        server.grpc_client.infer(...)

Deferred import: ``tritonclient.http`` (gevent, ~0.1 s) at the first HTTP client: ``from lab_backends
import TritonServer`` and ``lab-backends --help`` import this module.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from lab_backends import rest
from lab_backends.errors import LabBackendsError, ModelLoadError, RemoteServerError
from lab_backends.paths import BACKEND_DIR, MODEL_REPOSITORY
from lab_backends.server import crash as _crash
from lab_backends.server import endpoints as _endpoints
from lab_backends.server import loading as _loading
from lab_backends.server.docker import DockerTarget
from lab_backends.server.local import LocalTarget
from lab_backends.server.logs import ServerLog
from lab_backends.server.model_status import broken_models
from lab_backends.server.options import ServerOptions
from lab_backends.server.readiness import probe_ready
from lab_backends.server.remote import RemoteTarget
from lab_backends.server.repository import ModelConfig, config_from_json, config_json
from lab_backends.server.target import Target


@dataclass(frozen=True)
class TargetSpec:
    """What a target factory needs from :class:`TritonServer`: handed over, never read from its state."""

    options: ServerOptions
    ports: tuple[int | None, int | None, int | None]
    backend_dir: Path
    run_dir: Path | None
    startup_timeout_s: float
    url: str | None
    grpc_url: str | None


TARGETS: dict[str, Callable[[TargetSpec], Target]] = {
    "local": lambda t: LocalTarget(t.options, t.ports, t.backend_dir, t.run_dir, t.startup_timeout_s),
    "remote": lambda t: RemoteTarget(t.url, t.grpc_url, t.startup_timeout_s),
    "docker": lambda t: DockerTarget(t.options, t.ports, t.startup_timeout_s),
}


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
            own = [name for name, value in (("model_repository", model_repository), ("backend_dir", backend_dir))
                   if value is not None]
            if own and not url and os.environ.get("TRITON_URL"):
                # A server that already runs never sees our folders: following TRITON_URL here would
                # serve the lesson from the wrong models (or a 403), far from this line.
                raise LabBackendsError(
                    f"TritonServer({', '.join(own)}=...) without a target, while TRITON_URL is set: the server "
                    f"at {os.environ['TRITON_URL']} cannot see your {' or '.join(own)}. Pass target=\"local\" to "
                    "start your own embedded server with them (in a lesson: target=fallback_target(...)), or "
                    "leave them out to use the server at TRITON_URL"
                )
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
        self.backend_dir = Path(backend_dir) if backend_dir else BACKEND_DIR
        self.broken_models: dict[str, str] = {}
        self._http_client = None
        self._grpc_client = None
        self._target: Target = TARGETS[target](TargetSpec(
            self.options, (http_port, grpc_port, metrics_port), self.backend_dir, Path(run_dir) if run_dir else None,
            startup_timeout_s, url or os.environ.get("TRITON_URL"), grpc_url or os.environ.get("TRITON_GRPC_URL")))

    # ------------------------------------------------------------------ endpoints (the target's)
    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP/REST endpoint, as ``tritonclient.http`` expects it."""
        return self._target.http_url

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` expects it."""
        return self._target.grpc_url

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics page."""
        return self._target.metrics_url

    host = property(lambda self: self._target.host)
    http_port = property(lambda self: self._target.http_port, lambda self, v: setattr(self._target, "http_port", v))
    grpc_port = property(lambda self: self._target.grpc_port, lambda self, v: setattr(self._target, "grpc_port", v))
    metrics_port = property(lambda self: self._target.metrics_port,
                            lambda self, v: setattr(self._target, "metrics_port", v))

    @property
    def run_dir(self) -> Path | None:
        return self._target.run_dir

    @property
    def endpoints(self) -> list[_endpoints.Endpoint]:
        """The pods of a multi-replica remote server (a list in ``TRITON_URL`` or ``TRITON_PODS``); else empty."""
        return self._target.endpoints

    @property
    def process(self) -> subprocess.Popen | None:
        """The server process when it is a child of ours (``local``), else ``None``."""
        return self._target.process

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path | None:
        return self._target.log_path

    @property
    def trace_file(self) -> Path | None:
        """Where the server writes traces; for ``remote``, ``TRITON_TRACE_FILE`` as the lab sees it."""
        return self._target.trace_file(self.options.trace_file)

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
        _crash.raise_if_crashed(self)  # a crash is explained on the next call, not as a bare connection error
        if self._http_client is None:
            import tritonclient.http as httpclient

            self._http_client = httpclient.InferenceServerClient(self.http_url, network_timeout=120.0)
        return self._http_client

    @property
    def grpc_client(self):
        """A ready ``tritonclient.grpc.InferenceServerClient``."""
        _crash.raise_if_crashed(self)
        if self._grpc_client is None:
            self._grpc_client = grpcclient.InferenceServerClient(self.grpc_url)
        return self._grpc_client

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
        return self._target.is_running()

    def exit_code(self) -> int | None:
        """The exit code of a server this object started, once it has exited; ``None`` while it runs
        (and always for a remote server, which we did not start)."""
        return self._target.exit_code()

    def is_ready(self) -> bool:
        return probe_ready(self.http_url)

    def model_ready(self, name: str) -> bool:
        """Whether ``name`` is loaded and READY; an unknown model or a server that is gone is simply not."""
        try:
            return bool(self.http_client.is_model_ready(name))
        except Exception:  # noqa: BLE001 - any failure to ask means "not ready"
            return False

    def start(self) -> "TritonServer":
        """Start (or, for ``remote``, check) the server; returns once it is ready and models are checked."""
        if self._target.start():
            try:
                self._check_models()
            except BaseException:
                self.stop()
                raise
        return self

    def restart(self) -> "TritonServer":
        """Start again after a crash (or any time): same models, same ports, so URLs stay valid."""
        ports = (self.http_port, self.grpc_port, self.metrics_port)
        self.stop()
        if all(ports) and hasattr(self._target, "requested_ports"):
            self._target.requested_ports = ports
        return self.start()

    def stop(self) -> None:
        """Stop what we started, by PID or container, and wait for it; a remote server is left running."""
        self._close_clients()
        self._target.stop()

    def _close_clients(self) -> None:
        for client in (self._http_client, self._grpc_client):
            try:
                if client is not None:
                    client.close()
            except Exception:  # noqa: BLE001 - closing a client must never mask the real error
                pass
        self._http_client = self._grpc_client = None

    # ------------------------------------------------------------------ log
    @property
    def log(self) -> ServerLog:
        """The server's log (empty for a remote server: its log is not on this machine)."""
        return ServerLog(self.log_path, self.admin_key)

    def log_text(self) -> str:
        """The server log so far (the admin key redacted)."""
        return self.log.text()

    # ------------------------------------------------------------------ models
    def repository_index(self) -> list[dict]:
        """Every model the server knows of, with ``state`` and, for a broken one, ``reason``."""
        status, body = rest.request(f"http://{self.http_url}/v2/repository/index", "POST", b"{}",
                                    {"Content-Type": "application/json", **self.admin_headers}, 10.0)
        if status != 200:
            raise RemoteServerError(f"repository index failed with HTTP {status}: {body.decode(errors='replace')}")
        return json.loads(body)

    def _check_models(self) -> None:
        """After readiness: is every model we asked for READY? Quote Triton's reason if not."""
        self.broken_models = broken_models(self.repository_index(), self.options, self._target.preflight,
                                           self.log, self.backend_dir)
        if self.broken_models and not self.allow_broken_models:
            name, reason = next(iter(self.broken_models.items()))
            raise ModelLoadError(
                name, reason, hint=f"fix the model folder, or pass allow_broken_models=True (log: {self.log_path})"
            )

    def load_model(self, name: str, config: Any = None, files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model through the restricted model-repository API.

        ``config`` may be a ``ModelConfig`` protobuf, a dict or a JSON string. Triton *replaces* the
        whole config with it, so derive overrides from :meth:`model_config` rather than writing a
        partial one. Without ``config``, a model loaded with an override keeps it unless its files
        changed on disk: unload it first to go back to ``config.pbtxt``.
        """
        if isinstance(config, ModelConfig):
            config = config_json(config)
        elif isinstance(config, dict):
            config = json.dumps(config)
        log_before = len(self.log.text())
        try:
            _loading.load(self, name, config, files)  # preflight + a deadline (load_timeout_s): no load hangs
        except InferenceServerException as exc:
            # The API answers e.g. "failed to poll from model repository"; the log says why.
            reason = self.log.reason(name, since=log_before)
            raise ModelLoadError(name, reason or exc.message() or str(exc)) from exc

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.http_client.unload_model(name, headers=self.admin_headers, unload_dependents=unload_dependents)

    def model_config(self, name: str):
        """The config the server is using for ``name``, as a ``ModelConfig`` protobuf."""
        return config_from_json(self.http_client.get_model_config(name))

    def statistics(self, name: str = "", timeout_s: float = 10.0) -> dict:
        """The statistics API (restricted: the admin key is sent for you), from any thread.

        A :class:`~lab_backends.errors.StatisticsError` says why when it does not answer (e.g. the
        model is not loaded).
        """
        if len(self.endpoints) > 1:  # one answer for the class: counts summed over the pods
            return _endpoints.summed_statistics(self, name, timeout_s)
        return _endpoints.statistics_payload(self.http_url, name, self.admin_headers, timeout_s)

