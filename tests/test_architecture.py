"""The package's layers, as docs/architecture.md states them, checked by reading every import.

Every module of ``lab_backends`` belongs to one layer; a module may import its own layer and the
layers below, never one above. Imports are read with ``ast`` from the source, including those
inside functions and under ``if TYPE_CHECKING``, so a lazy import cannot hide an upward call.
Also: no module over 350 lines (small modules with one job each).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lab_backends.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "lab_backends"
DOC = PROJECT_ROOT / "docs" / "architecture.md"
#: Bottom to top. A top-level module or sub-package not listed here fails the test: place it.
LAYERS: list[tuple[str, set[str]]] = [
    ("basics", {"errors", "paths", "waiting", "rest", "notebook", "digits"}),
    ("server", {"server"}),
    ("client", {"client"}),
    ("measure", {"measure"}),
    ("lessons", {"lessons"}),
    ("entry", {"cli", "book", "__init__"}),
]
RANK = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}
MAX_LINES = 350


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _layer_part(module: str) -> str:
    """``lab_backends.server.local`` -> ``server``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, root: Path = PROJECT_ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path = PROJECT_ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``lab_backends`` import in ``path``, at any depth of the tree."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from lab_backends import rest" imports the module lab_backends.rest
            if target == "lab_backends":
                found += [(node.lineno, f"lab_backends.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, mod) for line, mod in found if mod == "lab_backends" or mod.startswith("lab_backends.")]


def test_every_module_is_in_a_layer() -> None:
    parts = {_layer_part(_module_name(p)) for p in _modules()}
    assert parts <= set(RANK), f"place {sorted(parts - set(RANK))} in a layer (here and in docs/architecture.md)"


def test_no_upward_import() -> None:
    upward = []
    for path in _modules():
        source = _layer_part(_module_name(path))
        for line, target in imported_modules(path):
            if RANK[_layer_part(target)] > RANK[source]:
                upward.append(f"{path.relative_to(PROJECT_ROOT)}:{line} ({source}) imports {target} "
                              f"({_layer_part(target)})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: imports hidden in a function or written relative are found, and are upward."""
    probe = tmp_path / "lab_backends" / "server" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from lab_backends.lessons import exercises\n    from ..measure import stats\n")
    found = [mod for _, mod in imported_modules(probe, tmp_path)]
    assert found == ["lab_backends.lessons", "lab_backends.measure"]
    assert all(RANK[_layer_part(mod)] > RANK["server"] for mod in found)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_the_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PROJECT_ROOT)} has {lines} lines: split it by job"


def test_the_doc_names_every_layer() -> None:
    text = DOC.read_text()
    for layer, parts in LAYERS:
        assert f"## {layer}" in text.lower() or f"**{layer}**" in text.lower(), f"docs/architecture.md lacks {layer}"
