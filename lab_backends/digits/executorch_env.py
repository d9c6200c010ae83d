"""ExecuTorch at set-up: a build environment of its own, and the ``digits_et`` program exported in it.

Why a second venv: ExecuTorch 1.5.1's Python side (the export) requires numpy >= 2 and torchao 0.18,
while the project's venv keeps numpy < 2 (Triton 2.51's Python stub reads inputs wrong with numpy 2:
docs/platform-notes). ``build/executorch-venv`` holds ``executorch==1.5.1`` and what it pulls in
(numpy 2, torchao, ...) but **no torch**: executorch does not depend on torch, so the project venv's
torch 2.13 is found through one ``.pth`` line naming the project's site-packages. Python appends a
``.pth`` folder *after* the venv's own site-packages, so the venv's numpy 2 shadows the project's
numpy 1.26 there, and nothing is ever installed into, or removed from, the project venv (the
``.pth`` is written after pip has finished, so pip never sees the project's packages either).
The same wheel ships ExecuTorch's C++ runtime (``executorch/lib/*.so``, ``executorch/include``):
:mod:`lab_backends.server.executorch_backend` builds ``lab_executorch`` against it.

Measured here (2 cores, the wheel in pip's cache): creating the venv 19 s of pip, 482 MB on disk
(no second torch: that would add 754 MB, the size of .venv's; ~740 MB once Python has compiled what the export imports);
exporting digits_et ~26 s (12 s in the export itself, the rest importing torch and ExecuTorch); the
program is 17 MB (the 64-2048-2048-10 MLP's weights, as ``model.pt``). Both steps are stale-checked:
a stamp names the pinned versions (a second set-up costs a stat), the program is rebuilt only when
``model.pt`` or the export script is newer.
``LAB_SKIP_EXECUTORCH=1`` skips both (``make lab`` stays as quick as before for a learner who does not
take lesson 09d; ``digits_et`` then fails to load, saying how to build it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lab_backends.built import copy_if_stale, locked
from lab_backends.errors import LabBackendsError
from lab_backends.paths import BUILD_DIR, MODEL_REPOSITORY

from .build import ARTIFACT_DIR

EXECUTORCH_VERSION = "1.5.1"
VENV_DIR = BUILD_DIR / "executorch-venv"
STAMP = ".lab-executorch-stamp"
PTH_NAME = "zz_lab_project_torch.pth"
EXPORT_SCRIPT = Path(__file__).resolve().parent / "export_et.py"
PROGRAM = ARTIFACT_DIR / "digits_et.pte"
PLACED = MODEL_REPOSITORY / "digits_et" / "1" / "model.pte"
#: The exported batch bound: the config's max_batch_size (the backend checks the two agree at load).
MAX_BATCH = 64
SKIP_ENV = "LAB_SKIP_EXECUTORCH"


class ExecuTorchSetupError(LabBackendsError):
    """The ExecuTorch build environment or the export failed; the message says what to run."""


@dataclass(frozen=True)
class ExportReport:
    """What :func:`build_digits_et` did, for set-up's summary line."""

    exported: bool
    seconds: float
    program: Path
    details: dict

    def summary(self) -> str:
        if self.details.get("skipped"):
            return f"digits_et (ExecuTorch) skipped: {SKIP_ENV} is set"
        if not self.exported:
            return f"digits_et (ExecuTorch) up to date: {self.program} ({self.program.stat().st_size // 1024} KB)"
        return (f"digits_et exported to ExecuTorch in {self.seconds:.1f} s ({self.details.get('bytes', 0) // 1024} KB, "
                f"delegated to {', '.join(self.details.get('delegates', [])) or 'nothing'}, max |diff| vs model.pt "
                f"{self.details.get('max_abs_diff', float('nan')):.2g})")


def skipped() -> bool:
    return os.environ.get(SKIP_ENV, "") not in ("", "0")


def venv_python(venv_dir: Path = VENV_DIR) -> Path:
    return Path(venv_dir) / "bin" / "python"


def site_packages(venv_dir: Path = VENV_DIR) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return Path(venv_dir) / "lib" / version / "site-packages"


def stamp_text() -> str:
    """What the venv was made from: the pinned version, this Python, the torch it borrows."""
    return json.dumps({"executorch": EXECUTORCH_VERSION, "python": sys.version.split()[0],
                       "torch_from": sysconfig.get_paths()["purelib"]}, sort_keys=True)


def runtime_root(venv_dir: Path = VENV_DIR) -> Path:
    """The installed ``executorch`` package: ``lib/`` (the C++ runtime) and ``include/``."""
    return site_packages(venv_dir) / "executorch"


def ensure_venv(venv_dir: Path = VENV_DIR, log: Callable[[str], None] = lambda m: None) -> Path:
    """Make the ExecuTorch venv when its stamp is missing or names other versions; its folder."""
    venv_dir = Path(venv_dir)
    stamp = venv_dir / STAMP
    if stamp.is_file() and stamp.read_text() == stamp_text():  # no lock to read: a class's build/ is read-only
        return venv_dir
    # Set-up builds the libraries in a thread while the models build: both steps may want the venv.
    with locked(venv_dir.parent / f".{venv_dir.name}.lock"):
        if stamp.is_file() and stamp.read_text() == stamp_text():  # made while we waited for the lock
            return venv_dir
        log(f"making the ExecuTorch build environment {venv_dir} (executorch=={EXECUTORCH_VERSION}, "
            "numpy 2; 20-50 s and ~0.5 GB, once) ...")
        started = time.perf_counter()
        shutil.rmtree(venv_dir, ignore_errors=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
        command = [str(venv_python(venv_dir)), "-m", "pip", "install", "--quiet", "--no-compile",
                   f"executorch=={EXECUTORCH_VERSION}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise ExecuTorchSetupError(
                f"pip could not install executorch=={EXECUTORCH_VERSION} into {venv_dir} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-1500:]}\n  fix the network or pip's index, then run "
                f"`lab-backends setup` again (or set {SKIP_ENV}=1 to go without lesson 09d)")
        # After pip: torch from the project venv, behind the venv's own packages (see the docstring).
        (site_packages(venv_dir) / PTH_NAME).write_text(sysconfig.get_paths()["purelib"] + "\n")
        stamp.write_text(stamp_text())
        log(f"  ExecuTorch environment ready in {time.perf_counter() - started:.0f} s")
        return venv_dir


def program_is_stale(program: Path = PROGRAM) -> bool:
    """True when the program is missing or older than the TorchScript file or the export script."""
    sources = (ARTIFACT_DIR / "model.pt", EXPORT_SCRIPT)
    return not program.is_file() or any(s.stat().st_mtime > program.stat().st_mtime for s in sources if s.exists())


def export_program(program: Path = PROGRAM, venv_dir: Path = VENV_DIR) -> dict:
    """Run ``export_et.py`` in the ExecuTorch venv; the JSON line it prints."""
    model_pt = ARTIFACT_DIR / "model.pt"
    if not model_pt.is_file():
        raise ExecuTorchSetupError(f"no {model_pt} to export from: run `lab-backends build-models` first")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    command = [str(venv_python(venv_dir)), str(EXPORT_SCRIPT), str(model_pt), str(program), str(MAX_BATCH)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise ExecuTorchSetupError(
            f"exporting digits_et failed (exit {result.returncode}): {(result.stderr or result.stdout).strip()[-1500:]}"
            f"\n  command: {' '.join(command)}")
    return json.loads(lines[-1])


def place(program: Path = PROGRAM, placed: Path = PLACED) -> bool:
    """Copy the program into digits_et's version folder when it differs; True when copied."""
    return copy_if_stale(program, placed)


def build_digits_et(force: bool = False, log: Callable[[str], None] = lambda m: None) -> ExportReport:
    """Set-up's model step: the venv, then the export when stale (or ``force``), then the copy."""
    started = time.perf_counter()
    if skipped():
        return ExportReport(False, 0.0, PROGRAM, {"skipped": True})
    ensure_venv(log=log)
    details: dict = {}
    exported = force or program_is_stale()
    if exported:
        log("exporting digits_et to ExecuTorch (XNNPACK, batch 1..64) ...")
        details = export_program()
    place()
    return ExportReport(exported, time.perf_counter() - started, PROGRAM, details)
