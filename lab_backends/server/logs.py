"""The one reader of a server's log: its text (admin key redacted), a tail, and why a model failed.

Triton says *that* a load failed through its APIs ("failed to poll from model repository") and *why*
only in its log. Every place that quotes the log (startup deadline, broken models at start, a
refused ``load_model``) reads it here, so the redaction and the failure filter exist once.
"""

from __future__ import annotations

import re
from pathlib import Path

#: "E1130 04:42:34.387511 2147 model_repository_manager.cc:1460] \"" before Triton's own words.
_LOG_PREFIX = re.compile(r'^[IEW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "?')
#: Lines that every CPU-only start prints and that explain nothing.
_NOISE = ("CudaDriverHelper", "NVML", "DCGM", "pinned memory", "unable to create stream")


def strip_prefix(line: str) -> str:
    """Triton's own words of a log line, without the glog prefix and quoting."""
    return _LOG_PREFIX.sub("", line).rstrip('"')


def failure_lines(lines: list[str], model: str) -> list[str]:
    """The lines that name ``model`` and say it failed or erred."""
    return [ln for ln in lines if f"'{model}'" in ln and ("fail" in ln.lower() or "error" in ln.lower())]


class ServerLog:
    """A server's log file, read on demand (``path`` may be ``None``: a remote server has none here)."""

    def __init__(self, path: Path | None, secret: str = "") -> None:
        self.path = path
        self.secret = secret

    def text(self) -> str:
        """The log so far, the admin key redacted."""
        if not self.path or not self.path.exists():
            return ""
        text = self.path.read_text(errors="replace")
        return text.replace(self.secret, "<admin-key>") if self.secret else text

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines that say something (start-up noise of a CPU-only machine left out)."""
        kept = [ln for ln in self.text().splitlines() if not any(n in ln for n in _NOISE)]
        return "\n".join(kept[-lines:])

    def reason(self, model: str, since: int = 0) -> str:
        """Why ``model`` failed, in Triton's words, from the log after character ``since``.

        A config parse error is logged on the line *before* Triton's "Poll failed for 'm'" line,
        which names the model; it is quoted first.
        """
        lines = self.text()[since:].splitlines()
        hits = failure_lines(lines, model)
        for i, line in enumerate(lines):
            if "Error parsing text-format" in line and f"'{model}'" in "".join(lines[i + 1 : i + 3]):
                hits.insert(0, line)
        return "\n".join(strip_prefix(h) for h in hits[-3:])
