"""The digits classifier behind every ``digits_*`` model: data, training, export, build.

``build_models()`` is what ``lab-backends build-models`` (and ``lab-backends setup``) runs.
"""

from .build import ARTIFACT_DIR, GPU_REPOSITORY, PLACEMENTS, build_models, install_python_backends
from .data import SEED, load_split, normalize

__all__ = [
    "ARTIFACT_DIR",
    "GPU_REPOSITORY",
    "PLACEMENTS",
    "SEED",
    "build_models",
    "install_python_backends",
    "load_split",
    "normalize",
]
