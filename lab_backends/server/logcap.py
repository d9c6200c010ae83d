"""Keep a server log from filling the disk.

Measured on Triton 2.51: a server at its open-file limit logs ~35 MB/s ("accept failed") for as
long as it runs. The watchdog calls :func:`cap_log` every couple of seconds: past ``max_bytes``
the log's last ``keep_bytes`` go to ``<log>.1`` (replacing the previous one) and the log starts
again, so at most about ``max_bytes + keep_bytes`` (plus two seconds of storm) stay on disk. The
server writes with ``O_APPEND``, so truncating under it is safe: its next line lands at the new end.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_LOG_BYTES = int(os.environ.get("LAB_MAX_LOG_BYTES", 64 * 1024 * 1024))
KEEP_BYTES = 4 * 1024 * 1024


def cap_log(path: str | Path, max_bytes: int = MAX_LOG_BYTES, keep_bytes: int | None = None) -> bool:
    """Rotate ``path`` if it is larger than ``max_bytes``; returns whether it did.

    ``LAB_MAX_LOG_BYTES`` (read when the watchdog starts) sets the default cap.
    """
    keep_bytes = keep_bytes if keep_bytes is not None else min(KEEP_BYTES, max_bytes // 4)
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= max_bytes:
        return False
    with open(path, "rb") as log:
        log.seek(max(0, size - keep_bytes))
        tail = log.read(keep_bytes)
    backup = path.with_name(path.name + ".1")
    backup.write_bytes(tail)
    with open(path, "r+b") as log:
        log.truncate(0)
    with open(path, "ab") as log:
        log.write(
            f"[lab_backends] log passed {max_bytes} bytes; its last {len(tail)} bytes are in {backup.name}\n".encode()
        )
    os.utime(path)
    return True
