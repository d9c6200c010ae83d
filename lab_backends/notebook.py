"""Small things every notebook needs: the size switch and a printed check mark.

``LAB_FAST=1`` (set by CI and by impatient learners) shrinks loads and repeat counts so that a
notebook runs top to bottom in seconds; the lessons and the assertions stay the same.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

#: True when ``LAB_FAST=1``: notebooks shrink their loads.
FAST = os.environ.get("LAB_FAST", "0") == "1"


def sized(full: T, fast: T) -> T:
    """``fast`` under ``LAB_FAST=1``, else ``full``: ``repeats = sized(50, 10)``."""
    return fast if FAST else full


def check(condition: bool, lesson: str) -> None:
    """Assert what a notebook teaches, and say so when it holds (a silent assert teaches nothing)."""
    if not condition:
        raise AssertionError(f"expected, but not observed on this server: {lesson}")
    print(f"✓ {lesson}")
