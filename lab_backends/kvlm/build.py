"""Build kvlm once, and place the TorchScript file where the served models load it.

Like ``lab_backends.charlm.build``: training runs only when ``build/models/kvlm/kvlm.pt`` is missing
or older than the code that makes it (this package's net, train and build modules), and the file is
copied into ``model_repository/<m>/1/kvlm.pt`` (git-ignored) for each model folder that exists
(``generate_kv``: the Python backend; ``generate_kv_paged``, ``generate_kv_contiguous`` and
``generate_kv_recompute``: the native one) when the copy there is missing or stale. A file lock makes
concurrent builds wait for each other.

The artifact is ``torch.jit.save(torch.jit.script(model))``: self-contained (its ``vocabulary`` and
``context`` are attributes of the scripted module), readable by ``torch.jit.load`` in a Python backend
and by ``torch::jit::load`` in C++ without this package.

Deferred imports: ``train`` and ``reference`` import torch (1-6 s), which only a (re)build needs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab_backends.built import copy_if_stale, locked, newer_than_code
from lab_backends.charlm.text import vocabulary, zen
from lab_backends.paths import BUILD_DIR, MODEL_REPOSITORY

ARTIFACT_DIR = BUILD_DIR / "models" / "kvlm"
ARTIFACT = ARTIFACT_DIR / "kvlm.pt"
METRICS = ARTIFACT_DIR / "metrics.json"
#: The served models' version folders (each loads ``kvlm.pt`` next to its model file).
MODELS = ("generate_kv", "generate_kv_paged", "generate_kv_contiguous", "generate_kv_recompute")
PLACEMENTS: tuple[Path, ...] = tuple(MODEL_REPOSITORY / m / "1" / "kvlm.pt" for m in MODELS)
_CODE = ("net.py", "train.py", "build.py")
#: What the built model is asked to recite after training (a line of the Zen; the sample goes in metrics.json).
SAMPLE_PROMPT = "Beautiful is better than ugly.\n"


@dataclass
class KvlmReport:
    trained: bool
    seconds: float
    metrics: dict
    copied: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        what = "trained" if self.trained else "up to date, nothing retrained"
        return (f"kvlm (transformer with a KV cache) {what} in {self.seconds:.1f} s (loss "
                f"{self.metrics.get('loss', float('nan')):.3f}); {len(self.copied)} file(s) placed")


def is_fresh(artifact: Path = ARTIFACT) -> bool:
    """True when the model and its metrics exist and are newer than every module that makes them."""
    here = Path(__file__).resolve().parent
    return newer_than_code((artifact, artifact.with_name(METRICS.name)), (here / name for name in _CODE))


def _train(artifact: Path, log: Callable[[str], None]) -> dict:
    import torch

    from .reference import generate, load
    from .train import train

    text = zen()
    log(f"training kvlm, a 2-layer transformer, on the Zen of Python ({len(text)} characters, fixed seed) ...")
    result = train(text, vocabulary(text))
    tmp = artifact.with_name(f".{artifact.name}.tmp{os.getpid()}")
    torch.jit.save(torch.jit.script(result.model), str(tmp))
    os.replace(tmp, artifact)
    sample = generate(load(artifact), SAMPLE_PROMPT, 60)
    metrics = {"loss": round(result.loss, 4), "steps": result.steps, "seconds": round(result.seconds, 2),
               "parameters": sum(p.numel() for p in result.model.parameters()),
               "vocab": len(result.model.vocabulary), "sample": SAMPLE_PROMPT + sample}
    log(f"  loss {result.loss:.3f} after {result.steps} steps in {result.seconds:.1f} s: {metrics['sample']!r}")
    artifact.with_name(METRICS.name).write_text(json.dumps(metrics, indent=2))  # last: its presence means complete
    return metrics


def build_kvlm(force: bool = False, log: Callable[[str], None] = lambda message: None, artifact: Path = ARTIFACT,
               placements: tuple[Path, ...] = PLACEMENTS) -> KvlmReport:
    """Train when stale (or ``force``), then copy the model into every placement whose model folder exists."""
    started = time.perf_counter()
    artifact = Path(artifact)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    with locked(artifact.parent / ".lock"):
        trained = force or not is_fresh(artifact)
        metrics = _train(artifact, log) if trained else json.loads(artifact.with_name(METRICS.name).read_text())
        copied = [dst for dst in placements if dst.parent.parent.is_dir() and copy_if_stale(artifact, dst)]
    return KvlmReport(trained, time.perf_counter() - started, metrics, copied)
