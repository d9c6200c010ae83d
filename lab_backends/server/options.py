"""Startup options for a Triton server, turned into its command line.

The same options drive the embedded server, the Docker container and (by hand) the compose file,
so they live here once. Everything that can only be chosen at startup sits here: the trace *file*
for instance cannot be set over the network later (the server answers 501).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

#: The admin APIs that are restricted by a key unless ``restricted_apis=()`` is asked for.
#: ``model-repository`` matters most: its load API can upload and run arbitrary ``model.py`` code.
RESTRICTED_APIS = ("model-repository", "statistics", "trace", "shared-memory", "logging")
ADMIN_HEADER = "admin-key"
#: gRPC sends restricted-protocol keys as metadata with this prefix (measured on 2.51).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass
class ServerOptions:
    """What a learner may want to choose when a server starts."""

    model_repositories: Sequence[Path]
    #: ``None`` loads every model in the repositories; a list loads only those (faster start).
    models: Sequence[str] | None = None
    trace_file: Path | None = None
    trace_level: Sequence[str] = ("TIMESTAMPS",)
    trace_rate: int = 1
    #: 0 writes the trace file at shutdown; N writes ``<file>.0``, ``<file>.1`` ... every N traces.
    trace_log_frequency: int = 0
    #: Bytes for the local response cache; ``None`` disables the cache.
    cache_size: int | None = None
    #: ``{"R": 1}`` turns the rate limiter on (``--rate-limit=execution_count``) with these resources.
    rate_limit_resources: dict[str, int] | None = None
    #: e.g. ``{"summary_latencies": "true"}`` -> ``--metrics-config summary_latencies=true``.
    metrics_config: dict[str, str] = field(default_factory=dict)
    restricted_apis: Sequence[str] = RESTRICTED_APIS
    admin_key: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    log_verbose: int = 0
    exit_timeout_s: int = 5
    extra_args: Sequence[str] = ()
    #: Preload gcc's AddressSanitizer runtime, for a C backend built with it (the C exercises' checkers:
    #: :mod:`lab_backends.server.sanitizer`); the free-quarantine preload then stays out.
    address_sanitizer: bool = False

    def args(
        self,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        backend_dir: Path | str,
        host: str = "127.0.0.1",
        repositories: Sequence[str] | None = None,
        cache_dir: Path | str | None = None,
    ) -> list[str]:
        """The ``tritonserver`` arguments. ``repositories`` overrides paths (inside a container)."""
        repos = repositories if repositories is not None else [str(p) for p in self.model_repositories]
        args = [f"--model-repository={r}" for r in repos]
        args += [
            f"--backend-directory={backend_dir}",
            f"--http-address={host}",
            f"--http-port={http_port}",
            f"--grpc-address={host}",
            f"--grpc-port={grpc_port}",
            f"--metrics-address={host}",
            f"--metrics-port={metrics_port}",
            "--allow-metrics=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            # Explicit control with everything loaded: learners can load/unload at will.
            "--model-control-mode=explicit",
            # Keep serving when one model is broken; TritonServer decides whether that is fatal.
            "--exit-on-error=false",
            "--strict-readiness=false",
            f"--log-verbose={self.log_verbose}",
        ]
        if self.models is None:
            args.append("--load-model=*")
        else:
            args += [f"--load-model={m}" for m in self.models]
        if self.trace_file is not None:
            args += [
                f"--trace-config=triton,file={self.trace_file}",
                f"--trace-config=triton,log-frequency={self.trace_log_frequency}",
                f"--trace-config=rate={self.trace_rate}",
            ]
            args += [f"--trace-config=level={level}" for level in self.trace_level]
        if self.cache_size is not None:
            if cache_dir is not None:
                args.append(f"--cache-directory={cache_dir}")
            args.append(f"--cache-config=local,size={int(self.cache_size)}")
        if self.rate_limit_resources:
            args.append("--rate-limit=execution_count")
            args += [f"--rate-limit-resource={name}:{count}" for name, count in self.rate_limit_resources.items()]
        args += [f"--metrics-config={k}={v}" for k, v in self.metrics_config.items()]
        if self.restricted_apis:
            spec = f"{','.join(self.restricted_apis)}:{ADMIN_HEADER}={self.admin_key}"
            args += [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]
        args += list(self.extra_args)
        return args

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that open the restricted APIs (empty when nothing is restricted)."""
        return {ADMIN_HEADER: self.admin_key} if self.restricted_apis else {}

    @property
    def grpc_admin_headers(self) -> dict[str, str]:
        return {GRPC_HEADER_PREFIX + ADMIN_HEADER: self.admin_key} if self.restricted_apis else {}
