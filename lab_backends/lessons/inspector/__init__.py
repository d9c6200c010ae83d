"""The request inspector: follow ONE learner-drawn request through Triton (notebook 11).

``RequestInspector`` (the panel, :mod:`.view`) over ``inspect`` (the experiment, :mod:`.core`); the
evidence each figure is read from lives in :mod:`.evidence`, the exchange (fit, send, bytes) in :mod:`.exchange`.
"""

from .core import Inspection, inspect
from .pad import SEVEN, stroke
from .view import RequestInspector

__all__ = ["Inspection", "RequestInspector", "SEVEN", "inspect", "stroke"]
