"""The admin key of ``lab-backends serve``: how to hand it to an upstream client, or lift it.

Triton restricts its admin APIs (model repository, statistics, trace, shared memory, logging) by a
key that it accepts **only as a command-line flag**. On a shared machine any local user can read
a process's command line (``ps``, ``/proc/<pid>/cmdline``), and with the key's model-repository
API they can upload a ``model.py`` that runs as the server's user. So the key protects against
web pages and other machines, not against other users of this machine: run the server as an
unprivileged user, one learner per machine or pod (see docs/reliability.md).

``serve --admin-key-file PATH`` writes the key to a file only its owner can read (0600), so an
upstream ``tritonclient`` example can be given it; ``TRITON_ADMIN_KEY`` chooses the key;
``serve --open-admin-apis`` lifts the restriction (with a warning) for running upstream examples
that cannot send a header (tritonclient's gRPC examples).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from lab_backends.errors import LabBackendsError

OPEN_WARNING = (
    "WARNING: admin APIs are OPEN (--open-admin-apis): anyone who can reach these ports can load "
    "models, i.e. upload and run code as this user. Use it only to run upstream examples, on a "
    "machine that is yours alone."
)


def write_key_file(path: str | Path, key: str) -> Path:
    """Write ``key`` to ``path`` readable by its owner only (created 0600, tightened if it existed)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
    finally:
        os.close(fd)
    return path


def serve_options(
    key_file: str | Path | None, open_apis: bool, environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """``TritonServer`` keyword arguments for the admin choices of ``serve``."""
    if open_apis and key_file:
        raise LabBackendsError("--open-admin-apis and --admin-key-file exclude each other: choose one")
    if open_apis:
        return {"restricted_apis": ()}
    key = environ.get("TRITON_ADMIN_KEY") or secrets.token_urlsafe(24)
    if len(key) < 16:
        raise LabBackendsError("TRITON_ADMIN_KEY is shorter than 16 characters: use a long random value")
    return {"admin_key": key}
