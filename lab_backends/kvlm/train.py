"""Train kvlm on the Zen of Python: seeded, one thread, deterministic algorithms, well under a minute.

Each step is a batch of windows of the text read cyclically (the end runs on into the beginning), each
window starting at a random character and at position 0: so a prompt cut from anywhere in the Zen is
continued by the Zen, which is what lets a test compare every served token with the reference decoder's
and see the model recite. AdamW with a cosine-decayed learning rate; the loss is next-character
cross-entropy over every position of every window. Measured here (2 cores shared with other work): 800
steps of 12 windows in 43-51 s, loss 0.023; torch's fused attention kernel (``scaled_dot_product_attention``)
made a step 3x faster than the written-out softmax, and 400 steps left the loss at 0.26 (no recitation).

torch is imported at the top: ``build.py`` imports this module only when it (re)trains.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .net import CONTEXT, KVLM, encode

SEED, STEPS, BATCH, LEARNING_RATE = 0, 800, 12, 1e-2


@dataclass
class TrainResult:
    model: KVLM
    loss: float  # mean cross-entropy of the last 20 steps (nats per character)
    steps: int
    seconds: float


def train(text: str, vocabulary: str, steps: int = STEPS, batch: int = BATCH, lr: float = LEARNING_RATE) -> TrainResult:
    started = time.perf_counter()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # the same sums every time, and set-up's compilers keep the other core
    torch.use_deterministic_algorithms(True)
    ids = torch.tensor(encode(vocabulary, text))
    looped = torch.cat([ids, ids[:CONTEXT + 1]])  # windows that run past the end continue at the beginning
    model = KVLM(vocabulary)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(SEED)
    losses: list[float] = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        starts = torch.randint(0, len(ids), (batch,), generator=generator)
        windows = torch.stack([looped[s:s + CONTEXT + 1] for s in starts.tolist()])
        logits = model(windows[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    tail = losses[-20:]
    return TrainResult(model, sum(tail) / len(tail), steps, time.perf_counter() - started)
