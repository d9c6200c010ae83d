"""``lab-backends serve`` run as a learner runs it, for the tests that drive its command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

import pytest

from lab_backends.errors import FrontDoorError
from lab_backends.server.front_door import nginx_binary
from lab_backends.server.processes import terminate
from lab_backends.waiting import poll
from tests.reliability.conftest import TEST_MODELS

ROOT = Path(__file__).resolve().parents[2]
#: Written by `make door-deps` when it could not install nginx: the reason to skip with.
NGINX_MISSING = ROOT / "test-artifacts" / "door" / "nginx-missing.txt"


def copy_models(models: Mapping[str, Path], repo: Path) -> Path:
    """A repository of its own for a serve: each model folder ``name`` copied from the repository it is in."""
    for name, repository in models.items():
        shutil.copytree(repository / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def require_nginx() -> None:
    """Skip, with the reason `make door-deps` recorded, when Debian's nginx (the front door) is missing."""
    try:
        nginx_binary()
    except FrontDoorError as exc:
        pytest.skip(NGINX_MISSING.read_text().strip() if NGINX_MISSING.exists() else str(exc))


class Serve:
    """``lab-backends serve`` as a learner runs it, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, tmp: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.out, self.err = tmp / "serve.out", tmp / "serve.err"
        cmd = [sys.executable, "-m", "lab_backends.cli", "serve", "--model-repository", str(TEST_MODELS),
               "--model", "rel_double", *flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(self.out, "w"), stderr=open(self.err, "w"),
                                     env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        text = poll(self.out.read_text, lambda t: "Ctrl-C stops" in t or self.proc.poll() is not None, 120, 0.2)
        assert "Ctrl-C stops" in text, f"serve did not start:\n{text}\n{self.err.read_text()}"
        self.http = re.search(r"HTTP/REST : http://(\S+)", text).group(1)
        self.grpc = re.search(r"gRPC +: (\S+)", text).group(1)
        self.metrics = re.search(r"metrics +: http://([^/\s]+)", text).group(1)
        self.pid = int(re.search(r"ready \(pid (\d+)\)", text).group(1))
        self.text = text

    def stop(self) -> None:
        terminate(self.proc)
