"""The front door's nginx configuration: what it refuses before a request reaches tritonserver.

Rendered from a :class:`DoorSettings` into one ``nginx.conf`` (nginx has no API to say this in; the
file is its interface). Each rule answers a measured fault of Triton 2.51 or a rule of its source at
r24.10 (server ``src/http_server.cc``, ``src/grpc/grpc_server.cc``):

- **form-encoded bodies of 1 MB or more -> 415.** A POST of about 4 MiB with ``Content-Type:
  application/x-www-form-urlencoded`` kills tritonserver with SIGSEGV on any path (pinned by
  ``tests/reliability/test_crashes.py``; 3 MiB was answered). Smaller ones pass: curl's ``--data``
  sends this type by default, and Triton reads such a body as the JSON it is. A form-encoded body
  of unknown length (chunked) is refused, as its size cannot be told before it is read.
- **any body over a limit sized to the served models -> 413**
  (:func:`~lab_backends.server.door_limits.body_limit`); the gRPC stream (``ModelStreamInfer``) has no
  limit, nginx counts a stream's messages as one body.
- **the admin key at the door**: the restricted HTTP paths are those Triton's handlers check
  (``http_server.cc`` L1137-L1146 and the dispatch at L4600-L4690), the gRPC methods those whose
  ``CallData`` reads ``restricted_keys_`` (``grpc_server.cc`` L1135-L2236). Without the key (or with
  a wrong one) HTTP answers 403, gRPC ``PERMISSION_DENIED``.
- **names with ``..``, ``/`` (raw or percent-encoded) or over 255 characters -> 400** in the path of
  any HTTP request (Triton joins a load's model name to the repository path as it is).

- **each learner's fair share** (:mod:`lab_backends.server.door_share`, a class's door): who sent a
  request, and how much of the door each learner may hold.

- **inference requests that crash Triton 2.51 -> 400/413** (nested JSON, shapes claiming more than
  they carry or than the model's config allows): with ``gateway_*_port`` set, every HTTP request with
  a body (POST, PUT, PATCH) and the gRPC methods ``ModelInfer`` and ``ModelStreamInfer`` go through the
  validating gateway (:mod:`lab_backends.server.door_gateway`, rules in
  :mod:`lab_backends.server.door_rules`), which also bounds each stream message and a stream's total;
  other requests go straight to tritonserver.

What it does not refuse: a gRPC load's model name (it travels inside a protobuf message nginx does not
read: the key is what guards it).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from lab_backends.errors import FrontDoorError
from lab_backends.notebook import RESTARTING
from lab_backends.server.door_limits import MIN_BODY
from lab_backends.server.door_share import FairShare, learners_lines, location_limits, too_many
from lab_backends.server.door_upstreams import grpc_target, metrics_target, upstreams
from lab_backends.server.options import ADMIN_HEADER, GRPC_HEADER_PREFIX, RESTRICTED_APIS

#: The HTTP paths of each restricted API, as nginx regexes on the decoded path (``$uri``): a
#: percent-encoded ``/`` decodes to one, so ``.+`` still matches what Triton's ``[^/]+`` did raw.
HTTP_RESTRICTED = {
    "model-repository": r"^/v2/repository(/|$)",
    "statistics": r"^/v2/models/(stats$|.+/stats$)",
    "trace": r"^/v2/(trace/setting$|models/.+/trace/setting$)",
    "shared-memory": r"^/v2/(system|cuda)sharedmemory(/|$)",
    "logging": r"^/v2/logging$",
}
#: The gRPC methods of each restricted API (``inference.GRPCInferenceService``).
GRPC_RESTRICTED = {
    "model-repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    "statistics": ("ModelStatistics",),
    "trace": ("TraceSetting",),
    "shared-memory": tuple(f"{kind}SharedMemory{op}" for kind in ("System", "Cuda")
                           for op in ("Status", "Register", "Unregister")),
    "logging": ("LogSettings",),
}
GRPC_SERVICE = "inference.GRPCInferenceService"
#: The door's answer while tritonserver is down (HTTP 503, gRPC UNAVAILABLE): what notebook.explain_restarts reads.
TRITON_DOWN = f"tritonserver is {RESTARTING} (restarting after a crash?): try again in a few seconds"
#: A name in a path: one folder, at most 255 bytes (a file name's limit on Linux).
MAX_NAME = 255
@dataclass(frozen=True)
class DoorSettings:
    """Where the door listens, where tritonserver listens behind it, and what it lets through."""

    http_port: int
    grpc_port: int
    metrics_port: int
    triton_http_port: int
    triton_grpc_port: int
    triton_metrics_port: int
    workdir: Path  # nginx's prefix: its config (0600, it holds the key), logs, pid and temp files
    body_limit: int = MIN_BODY
    restricted_apis: Sequence[str] = RESTRICTED_APIS
    admin_key: str | None = field(default=None, repr=False)  # None: the admin APIs are open at the door too
    host: str = "127.0.0.1"
    #: Set when nginx's master runs as root: its workers run as this user and group.
    worker_user: str | None = None
    worker_group: str = "nogroup"
    #: Per-learner identity and limits (a class); ``None``: everyone is ``-`` and nothing is limited.
    fair_share: FairShare | None = None
    #: The validating gateway's ports (door_gateway.py); ``None``: requests go to tritonserver unchecked.
    gateway_http_port: int | None = None
    gateway_grpc_port: int | None = None
    #: ``serve --standby``: a second tritonserver's metrics port; the gateway relays everything else (door_upstreams).
    standby_metrics_port: int | None = None

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"


@dataclass(frozen=True)
class GatewaySettings:
    """What the validating gateway (door_gateway.py, a process of its own) needs: where tritonserver
    listens, which repositories it serves, the bounds."""

    triton_http_port: int
    triton_grpc_port: int
    repositories: tuple[str, ...]
    message_limit: int          #: bytes of one HTTP body (decompressed) or one gRPC message
    stream_limit: int           #: bytes of one gRPC stream, all its messages together
    ready_file: str             #: written with {"http_port", "grpc_port", "pid"} once both listen
    host: str = "127.0.0.1"
    triton_down: str = TRITON_DOWN  #: the answer while tritonserver is down (nginx gives the same)
    standby_http_port: int | None = None  #: serve --standby's second tritonserver (gateway_failover)
    standby_grpc_port: int | None = None
    servers_file: str | None = None  #: the servers' PIDs, written by serve after each start (gateway_failover)
    http_port: int = 0  #: where the gateway listens: 0, free ports at its first start; the same ones when restarted
    grpc_port: int = 0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({**asdict(self), "repositories": list(self.repositories)}))

    @classmethod
    def read(cls, path: Path) -> "GatewaySettings":
        data = json.loads(path.read_text())
        return cls(**{**data, "repositories": tuple(data["repositories"])})


def render(settings: DoorSettings) -> str:
    """The whole ``nginx.conf`` for ``settings``."""
    return "\n".join([
        *_main(settings),
        "http {",
        *_indent(_http_common(settings)),
        *_indent(_http_server(settings)),
        *_indent(_grpc_server(settings)),
        *_indent(_metrics_server(settings)),
        "}",
        "",
    ])


def _main(s: DoorSettings) -> list[str]:
    return [
        "# Written by lab-backends serve --front-door (lab_backends/server/door_config.py); do not edit.",
        "daemon off;  # a child of serve, stopped by its PID",
        "worker_processes 1;",
        *([f"user {s.worker_user} {s.worker_group};"] if s.worker_user else []),
        f"pid {s.workdir / 'nginx.pid'};",
        f"error_log {s.error_log} warn;",
        "events { worker_connections 4096; }",
    ]


def _http_common(s: DoorSettings) -> list[str]:
    restricted = sorted(set(s.restricted_apis))
    lines = [
        f"client_body_temp_path {s.workdir / 'body'};",
        *[f"{kind}_temp_path {s.workdir / kind};" for kind in ("proxy", "fastcgi", "uwsgi", "scgi")],
        "log_format door '$time_iso8601 $remote_addr:$remote_port learner=$door_learner \"$request\" $status '",
        "                '$request_length>$bytes_sent ${request_time}s upstream=$upstream_status';",
        f"access_log {s.access_log} door;",
        f"client_max_body_size {s.body_limit};",
        "client_body_buffer_size 1m;",
        # Bad input: the form encoding that crashes Triton 2.51, whatever the path.
        "map $http_content_type $door_form_type {",
        "    default 0;",
        "    ~*^application/x-www-form-urlencoded 1;",
        "}",
        # Form-encoded and 1 MB or more (7 digits), or of unknown length (chunked). Small ones pass:
        # curl -d sends JSON with this type, and Triton reads it as JSON (3 MiB was answered).
        'map "$door_form_type:$content_length" $door_form {',
        "    default 0;",
        r'    "~^1:([0-9]{7,})?$" 1;',
        "}",
        # Names: '..' or '/' inside a name, raw or percent-encoded, or a name over 255 characters.
        "map $request_uri $door_bad_name {",
        "    default 0;",
        r'    "~*(\.|%2e)(\.|%2e)" 1;',
        r'    "~*%2f" 1;',
        f'    "~^/v2/(repository/)?models/[^/?]{{{MAX_NAME + 1},}}" 1;',
        "}",
        "map $uri $door_http_restricted {",
        "    default 0;",
        *[f'    "~{HTTP_RESTRICTED[api]}" 1;' for api in restricted],
        "}",
        "map $request_uri $door_grpc_restricted {",
        "    default 0;",
        *[f'    "~^/{re.escape(GRPC_SERVICE)}/{method}$" 1;' for api in restricted for method in GRPC_RESTRICTED[api]],
        "}",
    ]
    http_var = "$http_" + ADMIN_HEADER.replace("-", "_")
    grpc_var = "$http_" + (GRPC_HEADER_PREFIX + ADMIN_HEADER).replace("-", "_")
    for name, var in (("http", http_var), ("grpc", grpc_var)):
        # No key (--open-admin-apis): every request passes, as at Triton's own ports.
        lines += [f"map {var} $door_{name}_key_ok {{", f"    default {0 if s.admin_key is not None else 1};"]
        lines += [f'    "{_quoted(s.admin_key)}" 1;'] if s.admin_key is not None else []
        lines += ["}", f'map "$door_{name}_restricted:$door_{name}_key_ok" $door_{name}_refused {{',
                  "    default 0;", '    "1:0" 1;', "}"]
    return lines + learners_lines(s.fair_share) + upstreams(s)


def _http_server(s: DoorSettings) -> list[str]:
    def refuse(condition: str, status: int, error: str) -> str:
        # JSON as Triton answers errors ({"error": ...}): tritonclient shows the message as it does Triton's.
        return f"""    if ({condition}) {{ return {status} '{{"error":"{error}"}}'; }}"""

    return [
        "server {",
        f"    listen {s.host}:{s.http_port};",
        "    default_type application/json;  # what the refusals below answer as",
        "    error_page 502 504 =503 @triton_down;",
        "    error_page 413 @too_large;",
        *(["    error_page 429 @too_many;"] if s.fair_share else []),
        # In the server's rewrite phase, before a location is chosen and its body limit applied: a
        # form-encoded body is named as such even when it is also too large.
        refuse("$door_form", 415, "the front door refuses form-encoded bodies of 1 MB or more (Triton 2.51 crashes "
               "on them; curl -d sends this type): send Content-Type: application/json"),
        refuse("$door_bad_name", 400, f"the front door refuses names with .. or / or over {MAX_NAME} characters: "
               "a model name is one folder of the repository"),
        refuse("$door_http_refused", 403, "the front door refuses this admin API without the admin key: send it "
               f"as header {ADMIN_HEADER} (or run the client under lab-backends with-key)"),
        "    location / {",
        f"        proxy_pass http://{s.host}:{s.triton_http_port};" if s.gateway_http_port is None else
        "        proxy_pass http://$door_http_upstream;",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_request_buffering off;",
        "        proxy_buffering off;  # generate_stream answers as it goes",
        "        proxy_read_timeout 3600s;",
        *location_limits(s.fair_share),
        "    }",
        "    location @too_large {",
        f"""        return 413 '{{"error":"the front door refuses bodies over {s.body_limit} bytes (the largest """
        """request a served model can take, as JSON at its max batch): send a smaller batch"}';""",
        "    }",
        "    location @triton_down {",
        f"""        return 503 '{{"error":"{TRITON_DOWN}"}}';""",
        "    }",
        *([ "    location @too_many {",
            f"""        return 429 '{{"error":"{too_many(s.fair_share)}"}}';""",
            "    }"] if s.fair_share else []),
        "}",
    ]


def _grpc_server(s: DoorSettings) -> list[str]:
    refuse = ("        if ($door_grpc_refused) { add_header grpc-status 7 always; add_header grpc-message "
              f'"the front door refuses this admin method without the admin key: send it as metadata '
              f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER} (or run the client under lab-backends with-key)\" always; "
              "return 200; }")
    timeouts = ["        grpc_read_timeout 3600s;", "        grpc_send_timeout 3600s;",
                *location_limits(s.fair_share, grpc=True)]
    proxy = [f"        grpc_pass grpc://{grpc_target(s)};", *timeouts]
    # The inference methods through the validating gateway, when there is one: it bounds a stream's messages.
    checked = proxy if s.gateway_grpc_port is None else ["        grpc_pass grpc://door_grpc_gateway;", *timeouts]
    busy = [
        "    error_page 429 = @too_many;",
        "    location @too_many {",
        "        default_type application/grpc;",
        f'        add_header grpc-status 8 always; add_header grpc-message "{too_many(s.fair_share)}" always;',
        "        return 200;",
        "    }",
    ] if s.fair_share else []
    # Kept-alive HTTP/2 connections to the gateway: a new one per call cost ~4 ms (measured, docs/scale.md).
    gateway = ["upstream door_grpc_gateway {", f"    server {s.host}:{s.gateway_grpc_port} max_fails=0;",
               "    keepalive 32;", "}"] if s.gateway_grpc_port else []
    return [
        *gateway,
        "server {",
        f"    listen {s.host}:{s.grpc_port} http2;",
        "    default_type application/grpc;  # what the door's own refusals answer as (door_share: no token)",
        # tritonserver down (restarting): gRPC UNAVAILABLE with the HTTP side's words, not nginx's bare 502.
        "    error_page 502 504 = @triton_down;",
        "    location @triton_down {",
        "        default_type application/grpc;",
        f'        add_header grpc-status 14 always; add_header grpc-message "{TRITON_DOWN}" always;',
        "        return 200;",
        "    }",
        # A unary message over the body limit: RESOURCE_EXHAUSTED in words, not a bare HTTP 413.
        "    error_page 413 = @too_large;",
        "    location @too_large {",
        "        default_type application/grpc;",
        f'        add_header grpc-status 8 always; add_header grpc-message "the front door refuses gRPC messages '
        f'over {s.body_limit} bytes (the largest request a served model can take): send a smaller batch" always;',
        "        return 200;",
        "    }",
        *busy,
        f"    location = /{GRPC_SERVICE}/ModelStreamInfer {{",
        "        client_max_body_size 0;  # a stream's messages add up to one body: only the gateway bounds it",
        *checked,
        "    }",
        *([f"    location = /{GRPC_SERVICE}/ModelInfer {{", *checked, "    }"] if s.gateway_grpc_port else []),
        "    location / {",
        "        default_type application/grpc;  # what the refusal below answers as",
        refuse,
        *proxy,
        "    }",
        "}",
    ]


def _metrics_server(s: DoorSettings) -> list[str]:
    """The metrics page, read-only: tritonserver's own port may be unreachable (netns.py)."""
    return [
        "server {",
        f"    listen {s.host}:{s.metrics_port};",
        "    location / {",
        "        limit_except GET { deny all; }",
        f"        proxy_pass http://{metrics_target(s)};",
        "    }",
        "}",
    ]


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else line for line in lines]


def _quoted(key: str) -> str:
    """The key inside a double-quoted nginx string (serve's keys are URL-safe: nothing to escape)."""
    if not re.fullmatch(r"[A-Za-z0-9_\-.~]+", key):
        raise FrontDoorError("the front door cannot hold this admin key: use URL-safe characters only "
                             "(A-Z a-z 0-9 _ - . ~), e.g. unset TRITON_ADMIN_KEY for a random one")
    return key
