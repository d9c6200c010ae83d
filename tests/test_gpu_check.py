"""The GPU check script and the GPU-only model configs, tested where no GPU is lent.

* every config.pbtxt meant for a GPU parses with Triton's model-config schema;
* ``scripts/gpu_check.sh --cpu-smoke`` runs end to end against a *real* tritonserver, from a bundle
  packed for this machine's Python (the GPU machine gets the 3.12 stub), and must report correct
  results from both the Python and the C backend and leave no server behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab_backends.paths import MODEL_REPOSITORY, PROJECT_ROOT
from lab_backends.server.repository import model_dirs, parse_config, read_config

GPU_REPOSITORY = PROJECT_ROOT / "model_repository_gpu"
CHECK_MODEL = PROJECT_ROOT / "scripts" / "gpu_check_models" / "gpu_torch"


def test_gpu_repository_configs_parse() -> None:
    if not GPU_REPOSITORY.is_dir() or not model_dirs([GPU_REPOSITORY]):
        pytest.skip("model_repository_gpu/ has no models yet")
    cpu_names = set(model_dirs([MODEL_REPOSITORY]))
    for name, folder in model_dirs([GPU_REPOSITORY]).items():
        config = read_config(folder)  # raises ModelConfigError with line and column
        assert config.name == name, f"{folder}: name {config.name!r} differs from its folder"
        # compose serves both repositories in one server: Triton refuses a name found twice.
        assert name not in cpu_names, f"{name} is in both model_repository/ and model_repository_gpu/"
        kinds = {group.kind for group in config.instance_group}
        assert kinds, f"{name}: no instance_group"


def test_check_model_configs_agree() -> None:
    gpu = read_config(CHECK_MODEL)
    cpu = parse_config((CHECK_MODEL / "configs" / "cpu_smoke.pbtxt").read_text(), "cpu_smoke.pbtxt")
    assert [g.kind for g in gpu.instance_group] == [gpu.instance_group[0].KIND_GPU]
    assert [g.kind for g in cpu.instance_group] == [cpu.instance_group[0].KIND_CPU]
    # Only the instance kind and the amount of deliberate work differ between the two.
    assert (gpu.name, gpu.backend, gpu.max_batch_size) == (cpu.name, cpu.backend, cpu.max_batch_size)
    assert list(gpu.input) == list(cpu.input) and list(gpu.output) == list(cpu.output)


def test_cpu_twin_differs_only_in_name_and_kind() -> None:
    """The GPU check's CPU figures are comparable only if cpu_torch is gpu_torch on another device."""
    gpu = read_config(CHECK_MODEL)
    twin = read_config(CHECK_MODEL.parent / "cpu_torch")
    assert twin.name == "cpu_torch" and [g.kind for g in twin.instance_group] == [gpu.instance_group[0].KIND_CPU]
    for config in (gpu, twin):
        config.ClearField("name")
        config.ClearField("instance_group")
    assert twin == gpu, "cpu_torch must keep gpu_torch's inputs, batching and deliberate work"


@pytest.mark.server
@pytest.mark.slow
def test_gpu_check_script_cpu_smoke(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    version = "%d.%d" % sys.version_info[:2]
    pack = subprocess.run(
        [sys.executable, "scripts/pack_gpu_bundle.py", "--out", str(bundle), "--preset", "-1",
         "--stub-python", version, "--no-numpy"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert pack.returncode == 0, pack.stdout + pack.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert "bin/tritonserver" in manifest["triton_bundle"]
    assert not [m for m in manifest["triton_bundle"] if "libpython" in m], "libpython is the machine's own"

    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_BUNDLE=str(bundle), PYTHON=sys.executable)
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu-smoke", "--work", str(tmp_path / "work"),
         "--requests", "60", "--concurrency", "4"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert report["verdict"] == "PASS" and report["py_correct"] is True
    assert report["py_device"] == "cpu"
    assert report["py_stats"]["inference_count"] >= 60
    assert sum(report["py_stats"]["batch_sizes"].values()) == report["py_stats"]["execution_count"]
    if (PROJECT_ROOT / "c_backends" / "scale" / "scale.c").exists():
        assert report["c_correct"] is True, report.get("c_backend")
    assert report["server_stopped"] is True
    pid = report["server_pid"]
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    assert (out / "gpu_check_report.md").read_text().startswith("# GPU check report")
