"""Build the character model once, and place its weights where the two generation models load them.

Idempotent like ``lab_backends.digits.build``: training runs only when ``build/models/charlm/
charlm.npz`` is missing or older than the code that makes it (this package's modules), and the file
is copied into ``model_repository/generate_*/1/`` (git-ignored) when the copy there is missing or
stale, so a repository folder mounted into a container serves the same weights. A file lock makes
concurrent builds wait for each other.

Deferred import: ``train`` imports torch (1-6 s), which only a (re)build needs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab_backends.built import copy_if_stale, locked, newer_than_code
from lab_backends.paths import BUILD_DIR, MODEL_REPOSITORY

from .net import CONTEXT, generate, load_weights, save_weights
from .raw import export_if_stale
from .text import vocabulary, zen

ARTIFACT_DIR = BUILD_DIR / "models" / "charlm"
ARTIFACT = ARTIFACT_DIR / "charlm.npz"
METRICS = ARTIFACT_DIR / "metrics.json"
#: The version folders that serve the weights (each model.py loads ``charlm.npz`` next to it).
PLACEMENTS: tuple[Path, ...] = tuple(MODEL_REPOSITORY / m / "1" / "charlm.npz"
                                     for m in ("generate_static", "generate_iterative"))
#: The C backend's copy (``c_backends/lab_iterative`` reads ``charlm.raw``, see ``raw.py``), exported from the npz.
RAW_PLACEMENTS: tuple[Path, ...] = (MODEL_REPOSITORY / "generate_iterative_c" / "1" / "charlm.raw",)
_CODE = ("text.py", "net.py", "train.py", "build.py")


@dataclass
class CharlmReport:
    trained: bool
    seconds: float
    metrics: dict
    copied: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        what = "trained" if self.trained else "up to date, nothing retrained"
        return (f"character model {what} in {self.seconds:.1f} s (next-character accuracy on the Zen "
                f"{self.metrics.get('accuracy', float('nan')):.3f}); {len(self.copied)} file(s) placed")


def is_fresh(artifact: Path = ARTIFACT) -> bool:
    """True when the weights and their metrics exist and are newer than every module that makes them."""
    here = Path(__file__).resolve().parent
    return newer_than_code((artifact, artifact.with_name(METRICS.name)), (here / name for name in _CODE))


def _train(artifact: Path, log: Callable[[str], None]) -> dict:
    from .train import train

    text = zen()
    log(f"training the character model on the Zen of Python ({len(text)} characters, PyTorch, fixed seed) ...")
    result = train(text, vocabulary(text))
    tmp = artifact.with_name(f".{artifact.name}.tmp{os.getpid()}")
    save_weights(result.weights, tmp)
    os.replace(tmp, artifact)
    prompt = "Beautiful is better than ugly.\n"  # a line of the Zen: the model recites what follows
    sample = generate(load_weights(artifact), prompt, 40)
    metrics = {"accuracy": result.accuracy, "steps": result.steps, "seconds": round(result.seconds, 2),
               "context": CONTEXT, "vocab": len(result.weights.vocab), "sample": prompt + sample}
    log(f"  accuracy {result.accuracy:.3f} after {result.steps} steps in {result.seconds:.1f} s: {metrics['sample']!r}")
    artifact.with_name(METRICS.name).write_text(json.dumps(metrics, indent=2))  # last: its presence means complete
    return metrics


def build_charlm(force: bool = False, artifact: Path = ARTIFACT, placements: tuple[Path, ...] = PLACEMENTS,
                 log: Callable[[str], None] = lambda message: None,
                 raw_placements: tuple[Path, ...] = RAW_PLACEMENTS) -> CharlmReport:
    """Train when stale (or ``force``), then copy the weights into every placement that exists as a model
    (and export ``charlm.raw`` for the C backend's)."""
    started = time.perf_counter()
    artifact = Path(artifact)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    with locked(artifact.parent / ".lock"):
        trained = force or not is_fresh(artifact)
        metrics = _train(artifact, log) if trained else json.loads(artifact.with_name(METRICS.name).read_text())
        # Only into model folders that exist (a checkout without the models gets nothing scattered around).
        copied = [dst for dst in placements if dst.parent.parent.is_dir() and copy_if_stale(artifact, dst)]
        copied += [dst for dst in raw_placements if dst.parent.parent.is_dir() and export_if_stale(artifact, dst)]
    return CharlmReport(trained, time.perf_counter() - started, metrics, copied)
