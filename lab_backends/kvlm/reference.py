"""The reference decoder every served token is compared with: greedy, and NO cache.

For each new token it runs the whole text so far (prompt + tokens generated) through the TorchScript
model and takes the argmax of the last position's logits (``torch.argmax``: the first maximum on a
tie). That is the definition of greedy decoding with nothing remembered between steps, so it is the
slowest correct decoder and the one a cache must agree with token for token.

:func:`decode` also returns each token's *margin* (its logit minus the runner-up's): a test that
compares served tokens with these can show first that no token is a near-tie that float rounding in a
different (batched, cached) order could flip.

torch is imported at the top: tests, the bench and the exercises' checkers import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lab_backends.errors import LabBackendsError

from .net import encode


@dataclass(frozen=True)
class Decoded:
    text: str  # the generated characters (exactly max_tokens of them)
    margins: tuple[float, ...]  # per token: top logit minus the second


def load(path: str | Path) -> torch.jit.ScriptModule:
    """The TorchScript file (``build/models/kvlm/kvlm.pt``) in evaluation mode."""
    if not Path(path).exists():
        raise LabBackendsError(f"{path} does not exist: run `lab-backends setup` to train kvlm")
    return torch.jit.load(str(path), map_location="cpu").eval()


def check_lengths(prompt: str, max_tokens: int, context: int = 256) -> None:
    """The spec's limits: a prompt of at least one character, at least one token, and both within the context."""
    if len(prompt) < 1 or max_tokens < 1 or len(prompt) + max_tokens > context:
        raise LabBackendsError(f"prompt of {len(prompt)} characters + max_tokens {max_tokens} must be >= 1 each "
                               f"and at most {context} together: shorten the prompt or ask for fewer tokens")


def decode(model: torch.jit.ScriptModule, prompt: str, max_tokens: int) -> Decoded:
    """Greedy decoding, recomputing the whole prefix for every token."""
    check_lengths(prompt, max_tokens, int(model.context))
    vocabulary = str(model.vocabulary)
    ids = encode(vocabulary, prompt)
    out, margins = [], []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids]))[0, -1]
            token = int(torch.argmax(logits))
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            out.append(vocabulary[token])
            ids.append(token)
    return Decoded("".join(out), tuple(margins))


def generate(model: torch.jit.ScriptModule, prompt: str, max_tokens: int) -> str:
    """The ``max_tokens`` characters greedy decoding appends to ``prompt``."""
    return decode(model, prompt, max_tokens).text
