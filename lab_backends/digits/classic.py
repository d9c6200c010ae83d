"""Two scikit-learn classifiers for the Python-based ``sklearn`` backend (``backends/sklearn``).

They exist to show framework support added without writing C: Triton has no scikit-learn
backend, yet ``backend: "sklearn"`` in a config serves these pickles through one shared
``model.py`` installed in the backend directory. They train on the same split and inputs
(normalized ``PIXELS``) as the MLP, so their answers can be compared with it.

Deferred import: scikit-learn (~3 s to import) only when an estimator is made.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from .data import SEED, DigitsSplit, load_split, normalize

#: model name in ``model_repository`` -> factory of an unfitted estimator.
CLASSIC_MODELS = ("digits_logreg", "digits_forest")


def make_estimator(name: str, seed: int = SEED) -> Any:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    if name == "digits_logreg":
        return LogisticRegression(max_iter=2000, random_state=seed)
    if name == "digits_forest":
        # n_jobs=1: the build must stay deterministic and polite on a shared 2-core machine.
        return RandomForestClassifier(n_estimators=40, max_depth=12, random_state=seed, n_jobs=1)
    raise KeyError(f"unknown classic model {name!r}; known: {', '.join(CLASSIC_MODELS)}")


def train_classic(name: str, split: DigitsSplit | None = None) -> tuple[Any, float]:
    """Fit one estimator on normalized pixels; return it and its held-out accuracy."""
    split = split or load_split()
    estimator = make_estimator(name)
    estimator.fit(normalize(split.train_images), split.train_labels)
    score = float((estimator.predict(normalize(split.test_images)) == split.test_labels).mean())
    return estimator, score


def save_pickle(estimator: Any, path: Path) -> Path:
    """Pickle atomically. Only ever load pickles you built yourself: unpickling runs code."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        pickle.dump(estimator, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return path


def predict_proba(path: Path, pixels: np.ndarray) -> np.ndarray:
    """Direct (server-free) probabilities from a built pickle, as a reference for tests."""
    with open(path, "rb") as handle:
        estimator = pickle.load(handle)
    return estimator.predict_proba(pixels).astype(np.float32)
