"""NVIDIA's example clients (``src/python/examples`` of triton-inference-server/client), unchanged, for the tests.

They are in no wheel, and this project commits no one else's code: they are read at test time, byte for byte,
from a clone of github.com/triton-inference-server/client at the tag of our Triton (r24.10).
``LAB_TRITON_CLIENT_REPO`` names the clone (a bare mirror will do); this machine's mirror otherwise. Without
one, the tests that run them skip and say how to get one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CLIENT_REPO = Path(os.environ.get("LAB_TRITON_CLIENT_REPO", "/work/.mirror/triton-inference-server+client/repo"))
CLIENT_REF = "r24.10"


def example_source(name: str) -> bytes:
    """The example ``name`` (e.g. ``simple_http_model_control``) as tagged; skips the test without a clone."""
    if not CLIENT_REPO.is_dir():
        pytest.skip(f"NVIDIA's example clients are in no wheel and not in this repository: set LAB_TRITON_CLIENT_REPO "
                    f"to a clone of github.com/triton-inference-server/client ({CLIENT_REF}); {CLIENT_REPO} is absent")
    return subprocess.run(["git", "-C", str(CLIENT_REPO), "show", f"{CLIENT_REF}:src/python/examples/{name}.py"],
                          capture_output=True, timeout=60, check=True).stdout
