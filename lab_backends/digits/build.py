"""``lab-backends build-models``: train, export and place every artifact the repositories serve.

Idempotent: the work is skipped when every artifact exists and is newer than the code that makes
it (a fresh clone has no artifacts, so it builds; editing ``train.py`` rebuilds). Artifacts are
written once under ``build/models/digits`` and copied INTO the model version folders
(``model_repository/digits_onnx/1/model.onnx`` ...), git-ignored, so that mounting a repository
folder into a container (the NGC image) serves the same files. A file lock makes concurrent
builds (two test sessions, a notebook) wait for each other instead of racing.

Deferred imports: ``train`` and ``export`` import torch (1-6 s), which only a (re)build needs; the
up-to-date check and ``ARTIFACT_DIR`` (imported by every ``lab_backends.digits`` user) stay cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab_backends.built import copy_if_stale, locked
from lab_backends.paths import BACKEND_DIR, BUILD_DIR, MODEL_REPOSITORY, PROJECT_ROOT

from .classic import CLASSIC_MODELS, save_pickle, train_classic
from .data import SEED, load_split

ARTIFACT_DIR = BUILD_DIR / "models" / "digits"
GPU_REPOSITORY = PROJECT_ROOT / "model_repository_gpu"
#: Python-based backends shipped as source: ``backends/<name>/model.py``.
BACKENDS_SOURCE = PROJECT_ROOT / "backends"
METRICS_FILE = "metrics.json"
#: The modules whose code decides the artifacts: newer code means stale artifacts.
_CODE = ("data.py", "net.py", "train.py", "export.py", "export_tf.py", "classic.py", "build.py")

#: Built file (in ARTIFACT_DIR) -> the version folders that serve it.
PLACEMENTS: dict[str, tuple[Path, ...]] = {
    "model.pt": (
        MODEL_REPOSITORY / "digits_torch" / "1" / "model.pt",
        MODEL_REPOSITORY / "digits_torch_native" / "1" / "model.pt",  # C++ backend lab_libtorch
        GPU_REPOSITORY / "digits_torch_gpu" / "1" / "model.pt",
    ),
    "model.onnx": (
        MODEL_REPOSITORY / "digits_onnx" / "1" / "model.onnx",
        GPU_REPOSITORY / "digits_onnx_gpu" / "1" / "model.onnx",
    ),
    # A directory (TensorFlow's SavedModel format), copied as a whole.
    "model.savedmodel": (
        MODEL_REPOSITORY / "digits_tf" / "1" / "model.savedmodel",
        MODEL_REPOSITORY / "digits_tf_native" / "1" / "model.savedmodel",  # C backend lab_tensorflow
        GPU_REPOSITORY / "digits_tf_gpu" / "1" / "model.savedmodel",
    ),
    "digits_logreg.pkl": (MODEL_REPOSITORY / "digits_logreg" / "1" / "model.pkl",),
    "digits_forest.pkl": (MODEL_REPOSITORY / "digits_forest" / "1" / "model.pkl",),
}


@dataclass
class BuildReport:
    """What :func:`build_models` did, for the CLI and for tests."""

    trained: bool
    seconds: float
    metrics: dict
    copied: list[Path] = field(default_factory=list)
    backends: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        what = "trained and exported" if self.trained else "up to date, nothing retrained"
        acc = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.get("test_accuracy", {}).items())
        return (
            f"digits models {what} in {self.seconds:.1f} s (held-out accuracy: {acc}); "
            f"{len(self.copied)} file(s) placed in model folders, {len(self.backends)} backend file(s) installed"
        )


def code_mtime() -> float:
    """Newest modification time of the code that produces the artifacts."""
    here = Path(__file__).resolve().parent
    return max((here / name).stat().st_mtime for name in _CODE)


def built_files(artifact_dir: Path = ARTIFACT_DIR) -> list[Path]:
    return [artifact_dir / name for name in (*PLACEMENTS, METRICS_FILE)]


def is_fresh(artifact_dir: Path = ARTIFACT_DIR) -> bool:
    """True when every built file exists and is newer than the code."""
    newest = code_mtime()
    return all(p.exists() and p.stat().st_mtime >= newest for p in built_files(artifact_dir))


def load_metrics(artifact_dir: Path = ARTIFACT_DIR) -> dict:
    return json.loads((artifact_dir / METRICS_FILE).read_text())


def _train_and_export(artifact_dir: Path, log: Callable[[str], None]) -> dict:
    from .export import ONNX_OPSET, export_onnx, export_torchscript
    from .export_tf import export_savedmodel
    from .train import train

    split = load_split()
    log("training the digits MLP (PyTorch, fixed seed) ...")
    result = train(split)
    log(f"  held-out accuracy {result.test_accuracy:.4f} after {result.epochs} epochs in {result.seconds:.1f} s")
    export_torchscript(result.model, artifact_dir / "model.pt")
    export_onnx(result.model, artifact_dir / "model.onnx")
    started = time.perf_counter()
    export_savedmodel(result.model, artifact_dir / "model.savedmodel")  # imports TensorFlow: seconds
    log(f"  TensorFlow SavedModel exported from the same weights in {time.perf_counter() - started:.1f} s")
    accuracies = {"digits_mlp": result.test_accuracy}
    for name in CLASSIC_MODELS:
        estimator, score = train_classic(name, split)
        save_pickle(estimator, artifact_dir / f"{name}.pkl")
        accuracies[name] = score
        log(f"  {name}: held-out accuracy {score:.4f}")
    metrics = {
        "seed": SEED,
        "onnx_opset": ONNX_OPSET,
        "train_size": int(len(split.train_labels)),
        "test_size": int(len(split.test_labels)),
        "test_accuracy": accuracies,
        "train_seconds": result.seconds,
    }
    tmp = artifact_dir / f".{METRICS_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(metrics, indent=2))
    os.replace(tmp, artifact_dir / METRICS_FILE)  # written last: its presence means "complete"
    return metrics


def _copy_if_stale(src: Path, dst: Path) -> bool:
    return _copy_tree_if_stale(src, dst) if src.is_dir() else copy_if_stale(src, dst)


def _tree_stamp(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime) for p in root.rglob("*") if p.is_file()}


def _copy_tree_if_stale(src: Path, dst: Path) -> bool:
    """A directory artifact (a SavedModel): copied whole, then renamed into place, when any file differs."""
    if dst.is_dir():
        want, have = _tree_stamp(src), _tree_stamp(dst)
        if want.keys() == have.keys() and all(have[k][0] == want[k][0] and have[k][1] >= want[k][1] for k in want):
            return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    old = dst.with_name(f".{dst.name}.old{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        os.replace(dst, old)  # a non-empty directory cannot be renamed over: move it aside first
    os.replace(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)
    return True


def place_artifacts(
    artifact_dir: Path = ARTIFACT_DIR, placements: dict[str, tuple[Path, ...]] | None = None
) -> list[Path]:
    """Copy built files into the version folders that serve them; returns what was copied."""
    copied = []
    for name, destinations in (PLACEMENTS if placements is None else placements).items():
        for dst in destinations:
            if _copy_if_stale(artifact_dir / name, dst):
                copied.append(dst)
    return copied


def python_based_backends() -> list[str]:
    """Names of the Python-based backends shipped in ``backends/`` (each a ``model.py``)."""
    if not BACKENDS_SOURCE.is_dir():
        return []
    return sorted(p.parent.name for p in BACKENDS_SOURCE.glob("*/model.py"))


def install_python_backends(backend_dir: Path = BACKEND_DIR) -> list[Path]:
    """Install ``backends/<name>/model.py`` as ``<backend_dir>/<name>/model.py``.

    Triton looks for ``libtriton_<name>.so`` first and, failing that, for a ``model.py`` in the
    same folder, which it runs with the Python backend: a backend written in Python.
    """
    installed = []
    for name in python_based_backends():
        dst = Path(backend_dir) / name / "model.py"
        if _copy_if_stale(BACKENDS_SOURCE / name / "model.py", dst):
            installed.append(dst)
    return installed


def build_models(
    force: bool = False,
    artifact_dir: Path = ARTIFACT_DIR,
    backend_dir: Path = BACKEND_DIR,
    log: Callable[[str], None] = lambda message: None,
) -> BuildReport:
    """Train/export when stale (or ``force``), then place artifacts and install Python backends."""
    start = time.perf_counter()
    artifact_dir = Path(artifact_dir)
    with locked(artifact_dir / ".lock"):
        trained = force or not is_fresh(artifact_dir)
        metrics = _train_and_export(artifact_dir, log) if trained else load_metrics(artifact_dir)
        copied = place_artifacts(artifact_dir)
        backends = install_python_backends(backend_dir)
    return BuildReport(trained, time.perf_counter() - start, metrics, copied, backends)
