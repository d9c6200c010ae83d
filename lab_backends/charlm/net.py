"""The character model's forward pass in numpy: the same arithmetic the two served models run.

The network reads the last ``CONTEXT`` characters (left-padded with spaces; a character it never
saw counts as a space), embeds each, and passes their concatenation through two ReLU layers to
one score per character of its vocabulary. Decoding is greedy (the highest score wins), so a
prompt always continues the same way: a test can compare served tokens with :func:`generate`.

One *step* is one forward pass over every sequence in flight at once (a matrix of ``B`` contexts):
the unit that static and iterative (continuous) batching schedule differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Characters the model reads before predicting the next one.
CONTEXT = 24


@dataclass(frozen=True)
class Weights:
    """The trained parameters (float32) and the vocabulary they score."""

    vocab: str
    emb: np.ndarray  # [V, E]
    w1: np.ndarray  # [CONTEXT * E, H]
    b1: np.ndarray
    w2: np.ndarray  # [H, H]
    b2: np.ndarray
    w3: np.ndarray  # [H, V]
    b3: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """What :func:`save_weights` writes (``np.savez`` keys); the vocabulary as an array of characters."""
        return {"vocab": np.array(list(self.vocab)), "emb": self.emb, "w1": self.w1, "b1": self.b1,
                "w2": self.w2, "b2": self.b2, "w3": self.w3, "b3": self.b3}


def save_weights(weights: Weights, path: Path) -> None:
    with open(path, "wb") as handle:  # a file object: np.savez would append .npz to a temporary name
        np.savez(handle, **weights.arrays())


def load_weights(path: str | Path) -> Weights:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return Weights(vocab="".join(arrays.pop("vocab").tolist()), **{k: v.astype(np.float32) for k, v in arrays.items()})


def context_ids(weights: Weights, text: str) -> np.ndarray:
    """The last CONTEXT characters of ``text`` as vocabulary indices (int64 [CONTEXT])."""
    index = {c: i for i, c in enumerate(weights.vocab)}
    space = index[" "]
    tail = text[-CONTEXT:].rjust(CONTEXT)
    return np.array([index.get(c, space) for c in tail], dtype=np.int64)


def step(weights: Weights, contexts: np.ndarray) -> np.ndarray:
    """One forward pass over B contexts (int [B, CONTEXT]) -> the B next character indices (greedy)."""
    x = weights.emb[contexts].reshape(len(contexts), -1)
    h = np.maximum(x @ weights.w1 + weights.b1, 0)
    h = np.maximum(h @ weights.w2 + weights.b2, 0)
    return np.argmax(h @ weights.w3 + weights.b3, axis=1)


def generate(weights: Weights, prompt: str, n: int) -> str:
    """The ``n`` characters that greedy decoding appends to ``prompt``, one step at a time."""
    text = prompt
    for _ in range(n):
        text += weights.vocab[int(step(weights, context_ids(weights, text)[None, :])[0])]
    return text[len(prompt):]
