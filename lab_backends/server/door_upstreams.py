"""The door's nginx upstreams: where HTTP requests go after nginx's checks (door_config renders the rest).

With the validating gateway, requests with a body go to it (it checks them, :mod:`door_gateway`), the others
straight to tritonserver. Under ``serve --standby`` (:mod:`lab_backends.server.standby`) there are two
tritonservers and the gateway alone chooses between them (:mod:`gateway_failover`): every HTTP request and
every gRPC method goes through it, so statistics, metadata and model control reach the server that
answers the inferences, and a server that nginx tried first would not answer for the one that serves.
Only the metrics page goes to tritonserver directly, the first server while it is up, else the second
(``backup``; ``proxy_next_upstream``'s default ``error timeout`` moves on when a connection is refused).

``max_fails=0``: a tritonserver that crashed is tried again at once when it is back, not after nginx's
10 s of marking it down. Kept-alive connections to the gateway save a TCP handshake a request.
"""

from __future__ import annotations

from typing import Any


def upstreams(s: Any) -> list[str]:
    """The ``upstream`` blocks and the method map for :class:`door_config.DoorSettings` ``s``."""
    lines = [] if s.standby_metrics_port is None else [
        "upstream door_metrics {", f"    server {s.host}:{s.triton_metrics_port} max_fails=0;",
        f"    server {s.host}:{s.standby_metrics_port} backup max_fails=0;", "}"]
    if s.gateway_http_port is None:
        return lines
    plain = "door_gateway" if s.standby_metrics_port is not None else "door_triton"
    return lines + [
        "upstream door_triton {", f"    server {s.host}:{s.triton_http_port} max_fails=0;", "}",
        "upstream door_gateway {", f"    server {s.host}:{s.gateway_http_port} max_fails=0;", "    keepalive 32;", "}",
        "map $request_method $door_http_upstream {",
        f"    default {plain};", "    POST door_gateway;", "    PUT door_gateway;", "    PATCH door_gateway;",
        "}",
    ]


def grpc_target(s: Any) -> str:
    """Where gRPC methods other than inference go: the gateway under ``--standby``, else tritonserver."""
    return "door_grpc_gateway" if s.standby_metrics_port is not None else f"{s.host}:{s.triton_grpc_port}"


def metrics_target(s: Any) -> str:
    return "door_metrics" if s.standby_metrics_port is not None else f"{s.host}:{s.triton_metrics_port}"
