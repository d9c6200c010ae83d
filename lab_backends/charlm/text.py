"""The text the character model learns: the Zen of Python, as the standard library ships it.

``this.py`` keeps the Zen ROT13-encoded in its variable ``s`` and prints it when imported; we read
the file's source with ``ast`` instead (nothing printed, nothing executed) and decode it. The text
is the same for a given Python version, on any machine, with nothing downloaded.
"""

from __future__ import annotations

import ast
import codecs
import importlib.util
from pathlib import Path

from lab_backends.errors import LabBackendsError


def zen() -> str:
    """The Zen of Python (856 characters on Python 3.11)."""
    spec = importlib.util.find_spec("this")
    if spec is None or spec.origin is None:
        raise LabBackendsError("the standard library's 'this' module is missing: cannot read the Zen of Python")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "s" and isinstance(node.value, ast.Constant)):
            return codecs.decode(node.value.value, "rot13")
    raise LabBackendsError(f"{spec.origin} has no string 's' (the ROT13 Zen): cannot read the Zen of Python")


def vocabulary(text: str) -> str:
    """Every character of ``text``, sorted, with the space (what unknown characters become) included."""
    return "".join(sorted(set(text) | {" "}))
