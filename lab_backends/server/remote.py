"""The ``remote`` target: a Triton that already runs (``TRITON_URL``), e.g. the GPU stack of docker-compose.

Nothing is started or stopped. Its endpoints are derived once, here, from the URLs given or the
environment: gRPC and metrics follow Triton's default layout (HTTP port + 1 and + 2) unless
``TRITON_GRPC_URL`` / ``TRITON_METRICS_URL`` say otherwise.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lab_backends.errors import RemoteServerError
from lab_backends.notebook import explain_restarts
from lab_backends.server.endpoints import pod_endpoints, primary_url
from lab_backends.server.readiness import probe_ready
from lab_backends.server.target import Target
from lab_backends.waiting import poll


def strip_scheme(url: str) -> str:
    """``host:port`` of a URL (``http://host:port/`` -> ``host:port``), as tritonclient expects it."""
    return re.sub(r"^\w+://", "", url).rstrip("/")


class RemoteTarget(Target):
    """A server found at a URL: reached, checked for readiness, never started or stopped here."""

    name = "remote"

    def __init__(self, url: str | None, grpc_url: str | None, startup_timeout_s: float) -> None:
        super().__init__()
        # A list of pods in TRITON_URL (or TRITON_PODS, a headless Service): inference goes to the
        # first; statistics, metrics and traces are read per pod (server/endpoints.py, measure/pods.py).
        self.endpoints = pod_endpoints(url)
        url = primary_url(url)
        self.url = url or ""
        self.startup_timeout_s = startup_timeout_s
        self._http = strip_scheme(self.url)
        host, _, port = self._http.rpartition(":")
        if self.url and not port.isdigit():
            raise RemoteServerError(f"the server URL {self.url!r} has no port: give host:port, e.g. http://localhost:8000")
        self.host = host or self.host
        self.http_port = int(port) if port.isdigit() else 0
        self._grpc = strip_scheme(grpc_url) if grpc_url else f"{host}:{self.http_port + 1}"
        self.grpc_port = int(self._grpc.rpartition(":")[2] or 0)
        self._metrics = os.environ.get("TRITON_METRICS_URL") or f"http://{host}:{self.http_port + 2}/metrics"
        self.metrics_port = self.http_port + 2

    @property
    def http_url(self) -> str:
        return self._http

    @property
    def grpc_url(self) -> str:
        return self._grpc

    @property
    def metrics_url(self) -> str:
        return self._metrics

    def trace_file(self, configured: Path | None) -> Path | None:
        """``TRITON_TRACE_FILE``, as the lab sees the file the remote server writes, unless one was given."""
        if configured is None and os.environ.get("TRITON_TRACE_FILE"):
            return Path(os.environ["TRITON_TRACE_FILE"])
        return configured

    def start(self) -> bool:
        if not self.url:
            raise RemoteServerError("target 'remote' needs url=... or the TRITON_URL environment variable")
        if not poll(lambda: probe_ready(self.http_url), bool, self.startup_timeout_s, 0.5):
            raise RemoteServerError(
                f"no ready Triton at {self.http_url} within {self.startup_timeout_s:.0f} s; start it "
                "(e.g. `docker compose up triton`) or unset TRITON_URL to use the embedded server"
            )
        explain_restarts()  # a shared server's restart, in a learner's notebook: one line, not a traceback
        return False
