"""Model loads that cannot hang: a preflight before, a deadline during, a named cause after.

Measured on Triton 2.51: reloading a Python model whose ``model.py`` was deleted never returns
(the stub exits, the model stays LOADING, and later loads of it hang too even after the file is
back). The load API then blocks its caller until the HTTP client's own timeout, which says only
"timed out". Here the files are checked first, as at start-up (:func:`repository.preflight`), and
the load runs on a client whose network timeout *is* the deadline, so a hang becomes a
:class:`~lab_backends.errors.ModelLoadError` naming the model, the deadline and the log's words.
"""

from __future__ import annotations

import time
from typing import Any

from lab_backends.errors import ModelLoadError
from lab_backends.server.repository import preflight

LOAD_TIMEOUT_S = 120.0


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
    from tritonclient.utils import InferenceServerException

    from lab_backends.server.crash import raise_if_crashed

    raise_if_crashed(server)
    timeout_s = timeout_s or getattr(server, "load_timeout_s", LOAD_TIMEOUT_S)
    preflight_load(server, name, files)
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=timeout_s, connection_timeout=timeout_s)
    started = time.monotonic()
    try:
        client.load_model(name, headers=server.admin_headers, config=config, files=files)
    except InferenceServerException:
        raise  # the server answered: TritonServer.load_model quotes the log's reason
    except Exception as exc:
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
