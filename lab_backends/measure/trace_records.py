"""The records of a Triton trace file and of its parts (``F``, ``F.0``, ``F.1``, ...), read as they are.

Below both readers of trace files: :mod:`lab_backends.measure.trace` folds the records into tables,
and :mod:`lab_backends.measure.pods` reads them to find the pod that served a request (whose file
``trace`` then reads). Neither of those is imported here, so they import each other in one direction.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lab_backends.errors import TraceError

_PART = re.compile(r"\.(\d+)$")


def trace_files(path: str | Path) -> list[Path]:
    """``F`` and/or its parts ``F.0``, ``F.1``, ... (numeric order) that exist now."""
    path = Path(path)
    parts = []
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            match = _PART.search(candidate.name)
            if match and candidate.name[: match.start()] == path.name:
                parts.append((int(match.group(1)), candidate))
    found = [p for _, p in sorted(parts)]
    if path.is_file():
        found.append(path)
    return found


def _read_one(path: Path) -> list[dict]:
    text = path.read_text()
    if not text.strip():
        return []
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path} is not a complete JSON array ({exc}); Triton may still be writing it. "
            "Read the trace after the server stopped (or its trace settings changed), or use trace_log_frequency=1."
        ) from exc
    if not isinstance(records, list):
        raise TraceError(f"{path} holds a {type(records).__name__}, not the JSON array Triton writes")
    return records


def read_records(path: str | Path) -> list[dict]:
    """Every record of a trace file and its parts, concatenated (order does not matter)."""
    files = trace_files(path)
    if not files:
        raise TraceError(
            f"no trace file at {path} (nor {Path(path).name}.0, ...). Start the server with "
            "trace_file=..., and note that with trace_log_frequency=0 the file appears only at shutdown "
            "(or when the trace settings change)."
        )
    records: list[dict] = []
    for file in files:
        records.extend(_read_one(file))
    return records
