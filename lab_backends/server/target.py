"""What the three targets (local, remote, docker) have in common: where the server listens.

:class:`~lab_backends.server.triton_server.TritonServer` is a facade over one :class:`Target`; a
target knows how to start, stop and look at *its* server, and where that server listens. A new
target (say, a Kubernetes pod) is a subclass in its own module plus one line in ``TARGETS`` of
``triton_server.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab_backends.errors import PortInUseError
from lab_backends.server.ports import LOCALHOST, free_ports, port_is_free
from lab_backends.server.readiness import probe_ready

Ports = tuple[int | None, int | None, int | None]


class Target:
    """A server's place: host and ports, its run folder (log), and how to start/stop/observe it."""

    #: The name users pass as ``TritonServer(target=...)``.
    name = ""

    def __init__(self) -> None:
        self.host = LOCALHOST
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.run_dir: Path | None = None
        #: Models left out of the start because they would hang it, with the reason (local only).
        self.preflight: dict[str, str] = {}
        #: The pods behind a multi-replica server (remote only; see :mod:`.endpoints`), else empty.
        self.endpoints: list = []

    # ------------------------------------------------------------------ where it listens
    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP/REST endpoint, as ``tritonclient.http`` expects it."""
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` expects it."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics page."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def log_path(self) -> Path | None:
        return self.run_dir / "tritonserver.log" if self.run_dir else None

    @property
    def process(self) -> subprocess.Popen | None:
        """The server process, when it is a child of this one."""
        return None

    def trace_file(self, configured: Path | None) -> Path | None:
        """Where the lab reads the trace file the server writes."""
        return configured

    def pick_ports(self, requested: Ports) -> None:
        """The requested ports (checked free), free ones for the rest."""
        for port in (p for p in requested if p):
            if not port_is_free(port):
                raise PortInUseError(
                    f"port {port} on {LOCALHOST} is already in use; pass another port or leave it "
                    "out and a free one is picked"
                )
        free = iter(free_ports(3))
        self.http_port, self.grpc_port, self.metrics_port = (p or next(free) for p in requested)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> bool:
        """Start the server (or find it); True when this call started one whose models must be checked."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop what this target started; nothing for a server it did not start."""

    def exit_code(self) -> int | None:
        """The server's exit code once it has exited, else ``None``."""
        return None

    def is_running(self) -> bool:
        return probe_ready(self.http_url)
