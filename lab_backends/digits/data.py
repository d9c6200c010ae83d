"""The 8x8 digits data set that scikit-learn ships, split and normalized the one agreed way.

Nothing is downloaded: ``sklearn.datasets.load_digits`` reads a file inside the scikit-learn
package. The split is fixed (seeded, stratified) so that every test, notebook and benchmark scores
the same held-out images, and the normalization here is *the* interface contract that the Python
and the C preprocessing models both implement: ``PIXELS = float32(IMAGE) / 8 - 1``.

Deferred import: scikit-learn (~3 s to import) only when the split is loaded, not by ``normalize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: One seed for the split, the weight init and the shuffling: change it and every artifact changes.
SEED = 0
#: Fraction of the 1797 images held out for scoring (never seen in training).
TEST_FRACTION = 0.2
#: Raw pixel values run 0..16 (the data set's own scale: counts of set pixels in 4x4 blocks).
MAX_PIXEL = 16
NUM_CLASSES = 10


@dataclass(frozen=True)
class DigitsSplit:
    """Raw uint8 images ``[N, 8, 8]`` and int64 labels for training and held-out scoring."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_split(seed: int = SEED, test_fraction: float = TEST_FRACTION) -> DigitsSplit:
    """The fixed, stratified train/held-out split of scikit-learn's digits (deterministic)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # values are whole numbers 0..16 stored as float64
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    return DigitsSplit(x_train, y_train, x_test, y_test)


def normalize(images: np.ndarray) -> np.ndarray:
    """Raw ``uint8 [N, 8, 8]`` (0..16) -> ``float32 [N, 64]`` in [-1, 1], exactly as served.

    Kept as one expression so that the Python preprocessing model, the C backend and this
    training code cannot drift apart: ``x / 8 - 1`` is exact in float32 for 0..16.
    """
    images = np.asarray(images)
    return (images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(8.0)) - np.float32(1.0)
