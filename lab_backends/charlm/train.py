"""Train the character model on the Zen of Python with PyTorch (CPU, fixed seed, a few seconds).

Every position of the text, read cyclically (the end runs on into the beginning), is one example:
the CONTEXT characters before it -> the character there. The whole text is one batch; Adam fits it
until (nearly) every next character is right. Generating then recites the Zen, looping at its end:
a deterministic stream of characters, which is all the batching lessons need from a "language
model". The weights leave as numpy arrays (:class:`~lab_backends.charlm.net.Weights`), so the served
models need numpy only, not torch.

torch is imported here at the top: ``build.py`` imports this module only when it (re)trains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .net import CONTEXT, Weights

SEED = 0
EMBED, HIDDEN = 16, 128


@dataclass
class TrainResult:
    weights: Weights
    accuracy: float  # next-character accuracy on the text it learned (greedy)
    steps: int
    seconds: float


def examples(text: str, vocab: str) -> tuple[np.ndarray, np.ndarray]:
    """(contexts int64 [N, CONTEXT], targets int64 [N]): every position of ``text`` read cyclically."""
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    looped = np.concatenate([ids[-CONTEXT:], ids])
    contexts = np.stack([looped[i:i + CONTEXT] for i in range(len(ids))])
    return contexts, ids


def train(text: str, vocab: str, max_steps: int = 1500, target_accuracy: float = 0.995) -> TrainResult:
    """Fit the network; stops early once the greedy accuracy on the text reaches ``target_accuracy``."""
    started = time.perf_counter()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # reproducible sums, and set-up leaves the other core alone
    x, y = (torch.from_numpy(a) for a in examples(text, vocab))
    v = len(vocab)
    emb = torch.nn.Embedding(v, EMBED)
    mlp = torch.nn.Sequential(torch.nn.Linear(CONTEXT * EMBED, HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, v))
    params = list(emb.parameters()) + list(mlp.parameters())
    optimizer = torch.optim.Adam(params, lr=3e-3)
    accuracy, step = 0.0, 0
    for step in range(1, max_steps + 1):
        logits = mlp(emb(x).reshape(len(x), -1))
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            accuracy = float((logits.argmax(1) == y).float().mean())
            if accuracy >= target_accuracy:
                break
    with torch.no_grad():
        accuracy = float((mlp(emb(x).reshape(len(x), -1)).argmax(1) == y).float().mean())
        layers = [m for m in mlp if isinstance(m, torch.nn.Linear)]
        arrays = [emb.weight] + [p for m in layers for p in (m.weight.T, m.bias)]
        emb_w, w1, b1, w2, b2, w3, b3 = (a.detach().numpy().astype(np.float32).copy() for a in arrays)
    weights = Weights(vocab, emb_w, w1, b1, w2, b2, w3, b3)
    return TrainResult(weights, accuracy, step, time.perf_counter() - started)
