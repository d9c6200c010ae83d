"""Waiting for a server we started to become ready, with a deadline, failing fast if it exits.

One wait, through :func:`lab_backends.waiting.poll`, for the local process and the container alike;
past the deadline the error quotes the log and, when Triton was still loading models, says which.
"""

from __future__ import annotations

import re
import time
from typing import Callable

from lab_backends import rest
from lab_backends.errors import ServerExitedError, ServerStartupTimeoutError
from lab_backends.server.logs import ServerLog
from lab_backends.waiting import poll


def probe_ready(http_url: str, timeout_s: float = 2.0) -> bool:
    """One look at ``/v2/health/ready``: True on HTTP 200, False on anything else or no answer."""
    try:
        return rest.request(f"http://{http_url}/v2/health/ready", "GET", timeout=timeout_s)[0] == 200
    except OSError:
        return False


def probe_metrics(metrics_url: str, timeout_s: float = 2.0) -> bool:
    """One look at the Prometheus page: True on HTTP 200, False on anything else or no answer."""
    try:
        return rest.request(metrics_url, "GET", timeout=timeout_s)[0] == 200
    except OSError:
        return False


def await_ready(http_url: str, exit_code: Callable[[], int | None], log: ServerLog, deadline: float,
                startup_timeout_s: float, metrics_url: str | None = None) -> None:
    """Return once ready; :class:`ServerExitedError` if it exits first, a timeout error past ``deadline``.

    With ``metrics_url``, ready also means its metrics page answers: tritonserver starts its
    endpoints in the order gRPC, HTTP, metrics (server ``src/main.cc`` at r24.10, ``StartEndpoints``,
    L239-L295), so ``/v2/health/ready`` can say yes while the metrics port still refuses connections
    (a fresh clone's ``test_metric_names_exist_on_a_real_server`` scraped in that gap once).
    """

    def look() -> tuple[int | None, bool]:
        code = exit_code()
        return code, code is None and probe_ready(http_url, timeout_s=1.0) and (
            metrics_url is None or probe_metrics(metrics_url, timeout_s=1.0))

    code, ready = poll(look, lambda seen: seen[0] is not None or seen[1], max(0.0, deadline - time.monotonic()), 0.1)
    if code is not None:
        raise ServerExitedError.with_log(
            f"tritonserver exited with code {code} before it was ready (log: {log.path})", log.tail())
    if ready:
        return
    tail = log.tail()
    loading = re.findall(r'"loading: ([^:"]+):', tail)
    hint = ""
    if loading:
        hint = (
            f" It was still loading {', '.join(sorted(set(loading)))}: a model that imports a "
            "heavy framework may need a longer startup_timeout_s, and a Python stub that cannot "
            "find its libraries hangs here with no error (check LD_LIBRARY_PATH)."
        )
    raise ServerStartupTimeoutError(
        f"tritonserver was not ready within {startup_timeout_s:.0f} s and was stopped.{hint}\n"
        f"last log lines ({log.path}):\n{tail}"
    )
