"""build/runs/ pruning: old unused run folders go, the newest and any in use stay."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from lab_backends.server.runs import prune


def test_prune_keeps_newest_and_busy(tmp_path):
    old = time.time() - 7200
    folders = []
    for i in range(8):
        folder = tmp_path / f"triton-{i}"
        folder.mkdir()
        (folder / "tritonserver.log").write_text("x")
        os.utime(folder / "tritonserver.log", (old + i, old + i))
        os.utime(folder, (old + i, old + i))
        folders.append(folder)
    (tmp_path / "other").mkdir()
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=folders[0])
    try:
        removed = prune(tmp_path, keep=3, min_age_s=3600)
    finally:
        busy.kill()
        busy.wait()
    assert sorted(p.name for p in removed) == [f"triton-{i}" for i in range(1, 5)]
    assert folders[0].exists() and all(f.exists() for f in folders[5:]) and (tmp_path / "other").exists()
    assert prune(tmp_path, keep=0, min_age_s=10**6) == []  # nothing old enough
