"""Tracing, from the client side: the trace settings API, where the trace file is, a burst to trace.

Apart from :mod:`lab_backends.measure.trace`, which reads trace *files*: these calls talk to the
server (the settings API is restricted, the admin key is sent) and change or cause what it writes.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from lab_backends import rest
from lab_backends.client.infer import make_inputs
from lab_backends.errors import TraceError
from lab_backends.server.running import RunningServer


def trace_path(server: RunningServer) -> Path:
    """Where this process can read ``server``'s trace file, or a :class:`TraceError` saying how to get one.

    A local server writes the file given at startup (``trace_file=``); a remote one writes where
    it was told, and ``TRITON_TRACE_FILE`` says where the lab sees it (docker-compose shares
    ``/traces`` between the two containers).
    """
    path = getattr(server, "trace_file", None)
    if path is None:
        raise TraceError(
            "this server has no trace file: start it with TritonServer(..., trace_file=path), or, for a "
            "remote server at TRITON_URL, set TRITON_TRACE_FILE to where this machine sees its trace file"
        )
    return Path(path)


def _trace_url(server: RunningServer, model: str = "") -> str:
    base = f"http://{server.http_url}/v2"
    return f"{base}/models/{model}/trace/setting" if model else f"{base}/trace/setting"


def trace_settings(server: RunningServer, model: str = "", use_key: bool = True) -> dict:
    """The trace settings the server uses now (global, or for one model).

    The trace API is restricted in this workbench, so the admin key is sent; ``use_key=False``
    shows what a client without it gets (a :class:`TraceError` quoting HTTP 403).
    """
    return _send(_trace_url(server, model), headers=server.admin_headers if use_key else {})


def update_trace_settings(server: RunningServer, model: str = "", **settings: Any) -> dict:
    """Change tracing at runtime, e.g. ``update_trace_settings(server, trace_rate=10)``.

    Values go to Triton as it expects them (lists for ``trace_level``, strings otherwise). The trace
    *file* can only be chosen at startup: ``trace_file=`` here is refused by Triton.
    """
    body = {k: (list(v) if isinstance(v, (list, tuple)) else str(v)) for k, v in settings.items()}
    return _send(_trace_url(server, model), body=json.dumps(body).encode(), method="POST",
                 headers={"Content-Type": "application/json", **server.admin_headers})


def _send(url: str, method: str = "GET", body: bytes | None = None, headers: Mapping[str, str] | None = None) -> dict:
    status, answer = rest.request(url, method=method, body=body, headers=headers, timeout=10)
    if status != 200:
        hint = " (the trace API is restricted: pass the server's admin key)" if status == 403 else ""
        raise TraceError(f"trace settings request failed with HTTP {status}: {answer.decode(errors='replace')}{hint}")
    return json.loads(answer)


def send_burst(server: RunningServer, model: str, inputs: dict, n: int, prefix: str = "burst",
               timeout_s: float = 60.0) -> list[str]:
    """Send ``n`` gRPC requests at once (``request_id`` = ``<prefix>-<i>``) and wait for all answers.

    Why: a single instance can run one batch at a time, so requests that arrive together must wait
    in the scheduler's queue: exactly what a trace should show. Under the dynamic batcher requests
    that arrive together may share one batch and none waits; on a model without a batcher each
    waits for the ones ahead of it, however the client's sends are spread. Returns the request ids.
    """
    if not 1 <= n <= 1000:
        raise TraceError(f"a burst of {n} requests is out of range: use 1..1000")
    done = threading.Semaphore(0)
    errors: list[str] = []

    def finished(result: Any, error: Any) -> None:
        if error is not None:
            errors.append(str(error))
        done.release()

    ids = [f"{prefix}-{i}" for i in range(n)]
    for rid in ids:
        server.grpc_client.async_infer(model, make_inputs(inputs), finished, request_id=rid)
    deadline = time.monotonic() + timeout_s
    for _ in ids:
        if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TraceError(f"the burst to {model!r} did not complete within {timeout_s:.0f} s")
    if errors:
        raise TraceError(f"{len(errors)} of {n} requests to {model!r} failed, e.g.: {errors[0]}")
    return ids
