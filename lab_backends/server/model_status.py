"""After a start: which requested models are not READY, and why, in Triton's words where it has some.

The reason is looked up in order: the preflight (a folder that would hang the load), a missing
folder, the repository index's ``reason``, the server log, and our own reading of the config; a
backend that cannot be found gets the command that builds it.
"""

from __future__ import annotations

from pathlib import Path

from lab_backends.server.logs import ServerLog
from lab_backends.server.options import ServerOptions
from lab_backends.server.repository import config_problem, model_dirs


def broken_models(index: list[dict], options: ServerOptions, preflight: dict[str, str], log: ServerLog,
                  backend_dir: Path) -> dict[str, str]:
    """``{model: reason}`` for every model asked for (all on disk when none were named) that is not READY."""
    by_name = {entry["name"]: entry for entry in index}
    on_disk = model_dirs(options.model_repositories)
    wanted = list(options.models) if options.models is not None else sorted(on_disk)
    broken: dict[str, str] = {}
    for name in wanted:
        entry = by_name.get(name)
        if entry and entry.get("state") == "READY":
            continue
        if name in preflight:
            reason = preflight[name]
        elif name not in on_disk and entry is None:
            reason = (
                f"there is no folder '{name}' with a config.pbtxt in "
                f"{', '.join(map(str, options.model_repositories))}; models there: {', '.join(sorted(on_disk))}"
            )
        else:
            reason = (entry or {}).get("reason") or log.reason(name) or "see the server log"
            detail = config_problem(on_disk[name]) if name in on_disk else None
            if detail and detail not in reason:
                reason += f"\n  {detail}"
            if "backend" in reason and ("unable to find" in reason or "not found" in reason.lower()):
                reason += (
                    f"\n  the backend library is not in {backend_dir}: run `lab-backends setup` "
                    "(or `make lab`), which builds the C backends"
                )
        broken[name] = reason
    return broken
