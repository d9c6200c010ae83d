"""The admin key of ``lab-backends serve``: how to hand it to an upstream client, or lift it.

Triton restricts its admin APIs (model repository, statistics, trace, shared memory, logging) by a
key that it accepts **only as a command-line flag**. On a shared machine any local user can read
a process's command line (``ps``, ``/proc/<pid>/cmdline``), and with the key's model-repository
API they can upload a ``model.py`` that runs as the server's user. So the key protects against
web pages and other machines, not against other users of this machine: run the server as an
unprivileged user, one learner per machine or pod (see docs/reliability.md).

``serve --admin-key-file PATH`` writes the key to a file only its owner can read (0600); HTTP
clients send it as header ``admin-key``, gRPC clients as metadata ``triton-grpc-protocol-admin-key``
(server ``src/grpc/grpc_server.h`` prefix ``triton-grpc-protocol-`` + the key's name, r24.10), and
``lab-backends with-key --key-file PATH -- python example.py`` adds it to every call of an
unchanged upstream ``tritonclient`` example. ``TRITON_ADMIN_KEY`` chooses the key.
``serve --open-admin-apis`` lifts the restriction (with a warning) for clients that can neither
send a header nor run under ``with-key`` (a non-Python tool).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from lab_backends.errors import LabBackendsError
from lab_backends.server.options import ADMIN_HEADER, GRPC_HEADER_PREFIX, RESTRICTED_APIS

SERVE_DESCRIPTION = """\
Run the embedded tritonserver (2.51) in the foreground until Ctrl-C or SIGTERM, on 127.0.0.1.

Model control is explicit (--model-control-mode=explicit): at start the server loads every model
of the repository, or only the --model NAME ones; a model that fails to load stops the start with
Triton's reason. Any other model of the repository stays unloaded until a client loads it through
the model-repository API, which the admin key restricts, e.g.:
  lab-backends with-key --key-file F -- python -c "import tritonclient.http as h; \\
      h.InferenceServerClient('127.0.0.1:PORT').load_model('NAME')"
(unload_model('NAME') unloads; get_model_repository_index() lists every model and its state).

Admin key: the admin APIs (model repository, statistics, trace, shared memory, logging) need it;
inference, health and metadata do not. It is random and never shown unless --admin-key-file F
writes it (mode 0600). HTTP clients send it as header 'admin-key', gRPC clients as metadata
'triton-grpc-protocol-admin-key'; `lab-backends with-key --key-file F -- python client.py` adds
it to every call of an unchanged tritonclient script. --open-admin-apis lifts it (a warning)."""

OPEN_WARNING = (
    "WARNING: admin APIs are OPEN (--open-admin-apis): anyone who can reach these ports can load "
    "models, i.e. upload and run code as this user. Use it only to run upstream examples, on a "
    "machine that is yours alone."
)


def banner(key_file: str | Path | None, open_apis: bool) -> list[str]:
    """``serve``'s lines about the admin key: where it is and how to send it (both header names,
    ``with-key``), or how to get it when it is neither handed over nor lifted (nothing when lifted:
    :data:`OPEN_WARNING` goes to stderr)."""
    if open_apis:
        return []
    if key_file:
        return [
            f"  admin key : in {key_file} (mode 0600, never printed); send it as HTTP header '{ADMIN_HEADER}' or",
            f"              as gRPC metadata '{GRPC_HEADER_PREFIX}{ADMIN_HEADER}' (tritonclient: headers=...),",
            f"              or run an unchanged tritonclient script: lab-backends with-key --key-file {key_file} "
            "-- python client.py",
        ]
    return [
        "  admin APIs: restricted by a per-server key that is never shown (model repository, statistics, trace,",
        "              shared memory, logging). To use them: --admin-key-file F (then `lab-backends with-key`),",
        "              or --open-admin-apis to lift the key (a warning: anyone reaching the ports can run code)",
    ]


def write_private(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only: created 0600 (tightened if it existed), never
    through a symbolic link planted at ``path`` (``O_NOFOLLOW``). Keys, secrets and configs holding them."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


def write_key_file(path: str | Path, key: str) -> Path:
    """Write ``key`` (one line) to ``path``, readable by its owner only (:func:`write_private`)."""
    return write_private(path, key + "\n")


#: What a class's shared server keeps behind the key (deploy/triton and ``make class``): statistics stay open,
#: so learners' lessons can read counts; model-repository (uploads and runs code) never does.
CLASS_RESTRICTED = ("model-repository", "trace", "shared-memory", "logging")


def restricted_list(text: str | None) -> tuple[str, ...] | None:
    """``serve --restricted-apis model-repository,trace`` -> the APIs behind the key (``None``: all of them).

    A class server keeps ``statistics`` open, as deploy/triton does: learners' lessons read counts.
    ``model-repository`` (uploads and runs code) must stay behind the key.
    """
    if text is None:
        return None
    apis = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = sorted(set(apis) - set(RESTRICTED_APIS))
    if unknown:
        raise LabBackendsError(f"--restricted-apis: unknown API {', '.join(unknown)}; "
                               f"choose from {','.join(RESTRICTED_APIS)}")
    if "model-repository" not in apis:
        raise LabBackendsError("--restricted-apis must keep model-repository (its load API runs uploaded code); "
                               "use --open-admin-apis to lift every restriction on purpose")
    return apis


def serve_options(
    key_file: str | Path | None, open_apis: bool, environ: Mapping[str, str] = os.environ,
    restricted: str | None = None,
) -> dict[str, Any]:
    """``TritonServer`` keyword arguments for the admin choices of ``serve``."""
    if open_apis and key_file:
        raise LabBackendsError("--open-admin-apis and --admin-key-file exclude each other: choose one")
    if open_apis:
        return {"restricted_apis": ()}
    key = environ.get("TRITON_ADMIN_KEY") or secrets.token_urlsafe(24)
    if len(key) < 16:
        raise LabBackendsError("TRITON_ADMIN_KEY is shorter than 16 characters: use a long random value")
    apis = restricted_list(restricted)
    return {"admin_key": key} if apis is None else {"admin_key": key, "restricted_apis": apis}
