"""Model loads that cannot hang or crash the server: a preflight before, a deadline during, a named cause after.

Measured on Triton 2.51: reloading a Python model whose ``model.py`` was deleted never returns
(the stub exits, the model stays LOADING, and later loads of it hang too even after the file is
back). The load API then blocks its caller until the HTTP client's own timeout, which says only
"timed out". Here the files are checked first, as at start-up (:func:`repository.preflight`), an
uploaded file name over 255 bytes is refused (Triton 2.51 aborts on it: :func:`refuse_long_file_names`), so is
a model name that is not one folder of the repository (:func:`refuse_unsafe_model_name`), and
the load runs on a client whose network timeout *is* the deadline, so a hang becomes a
:class:`~lab_backends.errors.ModelLoadError` naming the model, the deadline and the log's words.

Deferred import: ``tritonclient.http`` (gevent, ~0.1 s), only when a model is loaded: this module
is on the import path of ``lab-backends --help``.
"""

from __future__ import annotations

import time
from typing import Any

from tritonclient.utils import InferenceServerException

from lab_backends.errors import ModelLoadError
from lab_backends.server.crash import raise_if_crashed, raise_if_dying
from lab_backends.server.repository import preflight

LOAD_TIMEOUT_S = 120.0
#: The longest file name (one path component) Linux allows, in bytes (NAME_MAX).
NAME_MAX = 255
#: The longest uploaded path accepted: PATH_MAX (4096) less room for Triton's temporary folder.
PATH_LIMIT = 4096 - 256


def refuse_long_file_names(name: str, files: dict[str, bytes] | None) -> None:
    """Refuse, before sending, a load whose uploaded ``files`` name a file over NAME_MAX bytes or a path
    over :data:`PATH_LIMIT` bytes: no file system can hold them, and Triton 2.51 does not answer such a
    load, it aborts.

    Measured: ``file:`` + 256 letters, or a 4095-byte path, kills the server (SIGABRT, "filesystem
    error: status: File name too long"): core ``model_repository_manager.cc`` line 118 at r24.10 calls
    the throwing ``std::filesystem::weakly_canonical`` and nothing catches it (docs/reliability.md).
    """
    for key in files or {}:
        path = key[len("file:"):] if key.startswith("file:") else key
        too_long = [part for part in path.split("/") if len(part.encode()) > NAME_MAX]
        if too_long or len(path.encode()) > PATH_LIMIT:
            what = (f"the file name {_short(too_long[0])!r} is {len(too_long[0].encode())} bytes, over the "
                    f"{NAME_MAX} a file name may have" if too_long else
                    f"the path {_short(path)!r} is {len(path.encode())} bytes, over {PATH_LIMIT}")
            raise ModelLoadError(name, f"refused before sending: in files[{_short(key)!r}] {what}; Triton 2.51 "
                                 "aborts on such a load (docs/reliability.md): use a shorter name")


def refuse_unsafe_model_name(name: str) -> None:
    """Refuse, before sending, a model name that is not one folder name: ``..`` or ``.``, a ``/``, a NUL,
    or over NAME_MAX bytes.

    Measured on Triton 2.51: a gRPC ``load_model("../outside")`` with the admin key loads and runs the
    model in the folder *next to* the repository (``tests/reliability/test_security.py`` pins it,
    ``upstream``): the name is joined to the repository path as it is. Our loads go over HTTP, where
    such a name answered 404 here, but a name that cannot be a folder of the repository is a mistake
    whichever way it travels.
    """
    bad = ("it is empty" if not name else
           f"'{name}' is not a folder name" if name in (".", "..") else
           "it holds a '/'" if "/" in name else
           "it holds a NUL byte" if "\0" in name else
           f"it is {len(name.encode())} bytes, over the {NAME_MAX} a folder name may have"
           if len(name.encode()) > NAME_MAX else "")
    if bad:
        raise ModelLoadError(_short(name), f"refused before sending: a model name is one folder of the repository, "
                             f"and {bad}", hint="name the model's folder itself, e.g. 'digits_torch'")


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:12]}…{text[-12:]}"


def preflight_load(server: Any, name: str, files: dict[str, bytes] | None) -> None:
    """Refuse a load that would hang, before asking the server (uploaded files are the caller's)."""
    if files:
        return
    problems = preflight(server.options.model_repositories, [name])
    if name in problems:
        raise ModelLoadError(name, problems[name], hint="restore the model file, then load again")


def load(
    server: Any, name: str, config: str | None, files: dict[str, bytes] | None, timeout_s: float | None = None
) -> None:
    """``load_model`` through a client whose network timeout is the load's deadline."""
    import tritonclient.http as httpclient

    raise_if_crashed(server)
    refuse_unsafe_model_name(name)
    refuse_long_file_names(name, files)
    timeout_s = timeout_s or getattr(server, "load_timeout_s", LOAD_TIMEOUT_S)
    preflight_load(server, name, files)
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=timeout_s, connection_timeout=timeout_s)
    started = time.monotonic()
    try:
        client.load_model(name, headers=server.admin_headers, config=config, files=files)
    except InferenceServerException:
        raise  # the server answered: TritonServer.load_model quotes the log's reason
    except Exception as exc:
        raise_if_dying(server)  # a crash under the load is named as one, with the log's words
        if time.monotonic() - started < timeout_s * 0.9:
            raise
        state = ""
        try:
            state = next((m.get("state", "") for m in server.repository_index() if m.get("name") == name), "")
        except Exception:  # noqa: BLE001 - the explanation must not hide the timeout
            pass
        tail = "\n".join(server.log_text().splitlines()[-5:])
        raise ModelLoadError(
            name,
            f"the load did not finish within {timeout_s:.0f} s (state: {state or 'unknown'}); "
            f"its initialize() may be stuck or its stub may have died. Last log lines:\n{tail}",
            hint="check initialize() of the model; a stub that died during a load can leave it hanging: "
            "restart the server (server.restart())",
        ) from exc
    finally:
        client.close()


def release_memory(server: Any, model: str) -> None:
    """Give back what one large request left held by a Python model: unload, then load it again.

    Measured on 2.51: after one 200 MB ``echo`` the Python backend's shared-memory pool stays at
    ~383 MiB (in ``/dev/shm``, mapped by server and stub: ~427 MiB RSS each) until the model is
    unloaded; the pool only grows. An unload + load brings both back to ~46 MiB and 1 MiB of shm.
    """
    server.unload_model(model)
    server.load_model(model)
