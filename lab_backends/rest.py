"""One plain HTTP call to the server: ``(status, body bytes)``, error statuses included.

Plain ``urllib`` rather than ``tritonclient.http``: it is safe from any thread (tritonclient's HTTP
client is gevent-based) and it shows the raw answer, which is what readiness polls, restricted-API
demonstrations and wire-level lessons need. Callers that want typed errors build them on top.

In a learner's server (a class), every call also carries the learner's identity headers
(:func:`lab_backends.learner.headers`), so the front door counts it as theirs; a header the caller
gives itself wins.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Mapping

from lab_backends import learner


def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes]:
    """Send one request; an HTTP error status is returned like a success, with its body."""
    req = urllib.request.Request(url, data=body, headers={**learner.headers(), **dict(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
