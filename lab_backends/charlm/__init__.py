"""A tiny character-level language model, trained at set-up, behind ``generate_static`` and ``generate_iterative``.

Nothing is downloaded: it learns the Zen of Python (the standard library's ``this`` module) in a few
seconds. ``build_charlm()`` is what ``lab-backends setup`` (and ``build-models``) runs; ``reference``
generates in-process with the same weights, so a test can compare the served tokens with it.
"""

from .build import ARTIFACT, PLACEMENTS, build_charlm, is_fresh
from .net import CONTEXT, Weights, generate, load_weights

__all__ = ["ARTIFACT", "CONTEXT", "PLACEMENTS", "Weights", "build_charlm", "generate", "is_fresh", "load_weights"]
