"""The package's layers, as docs/architecture.md states them, checked by reading every import.

Every module of ``lab_backends`` belongs to one layer; a module may import its own layer and the
layers below, never one above. Imports are read with ``ast`` from the source, including those
inside functions and under ``if TYPE_CHECKING``, so a lazy import cannot hide an upward call.
Also: no module over 350 lines (small modules with one job each), and no import cycle between
modules: none at module level, and none hidden by an import inside a function either, unless that
one import is allow-listed in ``CYCLE_ALLOWED`` with its reason. Imports go at the top of a module:
one inside a function is allowed only for a heavy or optional package listed in ``DEFERRABLE`` with
its reason, or for a module of ours that imports such a package at its top.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab_backends.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "lab_backends"
DOC = PROJECT_ROOT / "docs" / "architecture.md"
#: Bottom to top. A top-level module or sub-package not listed here fails the test: place it.
LAYERS: list[tuple[str, set[str]]] = [
    ("basics", {"errors", "paths", "waiting", "rest", "learner", "notebook", "built", "digits", "charlm", "kvlm"}),
    ("server", {"server"}),
    ("client", {"client"}),
    ("measure", {"measure"}),
    ("lessons", {"lessons"}),
    ("classroom", {"classroom"}),
    ("entry", {"cli", "setup_steps", "book", "__init__"}),
]
RANK = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}
MAX_LINES = 350
#: Imports allowed to close an import cycle, each with its reason: (importer, imported) -> why. Only a
#: deferred import (inside a function) may be listed; a cycle at module level is never allowed.
CYCLE_ALLOWED: dict[tuple[str, str], str] = {}
#: What a module may import inside a function (deferred), each with why: everything else goes at the top
#: of the module. A key is a package or a sub-module ("tritonclient.http") and covers what lies below it.
#: A module of this package may be deferred too, when it imports one of these at its top (found, not listed).
DEFERRABLE: dict[str, str] = {
    "torch": "1-6 s to import; only training, export and the in-process reference answers run it",
    "sklearn": "~3 s to import; only training and loading the digits split need it",
    "onnxruntime": "~0.1 s and a native runtime; only the in-process reference answers run it",
    "tensorflow": "3-11 s and ~700 MB to import; only the SavedModel export and its offline check run it",
    "matplotlib": "~1 s to import; only drawing a figure needs it",
    "pandas": "~0.4 s to import: `lab-backends --help` (the server layer, the CLI) does without it",
    "ipywidgets": "~0.3 s; only a widget built in a notebook needs it, the same modules serve headless audits",
    "ipycanvas": "~0.3 s; only the drawing pad built in a notebook needs it",
    "docker": "the Docker SDK, for the docker target only; every TritonServer imports server/docker.py",
    "tritonclient.http": "gevent-based (~0.1 s): `lab-backends --help` imports the server layer and the client package",
    "lab_backends.classroom.limits_notice": "kernel_startup.py runs at every learner kernel's start, where importing "
                                            "lab_backends (tritonclient, gRPC) would lengthen the start; it waits for "
                                            "the first cell",
}


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


@dataclass(frozen=True)
class Edge:
    """One import between two modules of the package; ``when`` is when it runs.

    ``module``: when the importer is imported (also inside ``try``/``if`` at module level);
    ``deferred``: inside a function, at its first call; ``typing``: under ``if TYPE_CHECKING``, never.
    """

    importer: str
    imported: str
    path: str
    line: int
    when: str


def _when(ancestors: list[ast.AST]) -> str:
    if any(isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for a in ancestors):
        return "deferred"
    if any(isinstance(a, ast.If) and "TYPE_CHECKING" in ast.unparse(a.test) for a in ancestors):
        return "typing"
    return "module"


def import_edges(root: Path = PROJECT_ROOT) -> list[Edge]:
    """Every import from one ``lab_backends`` module of ``root`` to another, resolved to modules.

    ``from lab_backends.measure import stats`` imports the module ``lab_backends.measure.stats``;
    ``from lab_backends import TritonServer`` the package ``lab_backends`` (its ``__init__``). The
    parents that Python runs first (``lab_backends/__init__.py`` for every module) are not counted:
    every module would share a cycle through the package's ``__init__``, which imports TritonServer.
    """
    paths = {_module_name(p, root): p for p in sorted((root / "lab_backends").rglob("*.py"))}
    edges: list[Edge] = []
    for importer, path in paths.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        rel = str(path.relative_to(root))

        def add(target: str, node: ast.stmt, ancestors: list[ast.AST]) -> None:
            while target and target not in paths:  # "import lab_backends.x.f" where f is no module
                target = target.rpartition(".")[0]
            if target:
                edges.append(Edge(importer, target, rel, node.lineno, _when(ancestors)))

        def visit(node: ast.AST, ancestors: list[ast.AST]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        add(alias.name, child, ancestors)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - (child.level - 1)] + ([base] if base else []))
                    for alias in child.names:
                        add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base, child, ancestors)
                visit(child, [*ancestors, child])

        visit(ast.parse(path.read_text(), str(path)), [])
    return edges


def import_cycles(edges: list[Edge]) -> list[list[str]]:
    """The modules of each import cycle (Tarjan's strongly connected components), sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def _describe(cycles: list[list[str]], edges: list[Edge]) -> str:
    lines = []
    for cycle in cycles:
        lines.append(" <-> ".join(cycle))
        lines += [f"    {e.path}:{e.line} imports {e.imported} ({e.when})" for e in edges
                  if e.importer in cycle and e.imported in cycle]
    return "\n".join(lines)


def test_no_import_cycle_at_module_level() -> None:
    edges = [e for e in import_edges() if e.when == "module"]
    cycles = import_cycles(edges)
    assert not cycles, ("import cycles at module level (move the shared piece into a module both can import):\n"
                        + _describe(cycles, edges))


def test_no_import_cycle_hidden_by_a_deferred_import() -> None:
    """An import inside a function (or under TYPE_CHECKING) that closes a cycle hides it; it is one still."""
    edges = [e for e in import_edges() if (e.importer, e.imported) not in CYCLE_ALLOWED]
    cycles = import_cycles(edges)
    assert not cycles, ("import cycles through deferred imports (move the shared piece into a module both can "
                        "import, or allow-list the deferred import in CYCLE_ALLOWED with its reason):\n"
                        + _describe(cycles, edges))


def test_every_allowed_cycle_import_is_deferred_and_needed() -> None:
    edges = import_edges()
    for pair, reason in CYCLE_ALLOWED.items():
        found = [e for e in edges if (e.importer, e.imported) == pair]
        assert found and reason, f"CYCLE_ALLOWED lists {pair}, which no module imports now, or gives no reason"
        assert all(e.when != "module" for e in found), f"{pair} is imported at module level: never allowed"
        assert import_cycles(edges) != import_cycles([e for e in edges if (e.importer, e.imported) != pair]), \
            f"{pair} closes no cycle any more: remove it from CYCLE_ALLOWED"


def test_the_cycle_checker_finds_fabricated_cycles(tmp_path: Path) -> None:
    """The checker itself: a module-level cycle, one hidden by a lazy or a relative import, a self-import."""
    files = {
        "__init__.py": "from lab_backends.top import run\n",  # a parent: not an edge of every module
        "top.py": "from lab_backends import pkg\nimport lab_backends.pkg.low\ndef run(): pass\n",
        "pkg/__init__.py": "",
        "pkg/low.py": "from lab_backends import errors\n",
        "errors.py": "",
        "a.py": "from lab_backends.b import thing\n",
        "b.py": "try:\n    from . import a\nexcept ImportError:\n    a = None\nthing = 1\n",
        "lazy.py": "from lab_backends.pkg.hidden import f\n",
        "pkg/hidden.py": "def f():\n    from ..lazy import g\n    return g\n",
        "user.py": "from lab_backends import run\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lab_backends import typed\n",
    }
    for name, text in files.items():
        (tmp_path / "lab_backends" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lab_backends" / name).write_text(text)
    edges = import_edges(tmp_path)
    assert ("lab_backends.top", "lab_backends.pkg", "module") in {(e.importer, e.imported, e.when) for e in edges}
    assert ("lab_backends.top", "lab_backends.pkg.low") in {(e.importer, e.imported) for e in edges}
    assert import_cycles([e for e in edges if e.when == "module"]) == [["lab_backends.a", "lab_backends.b"]]
    assert ("lab_backends.user", "lab_backends") in {(e.importer, e.imported) for e in edges}  # a name, no module
    assert import_cycles(edges) == [["lab_backends.a", "lab_backends.b"],
                                    ["lab_backends.lazy", "lab_backends.pkg.hidden"], ["lab_backends.typed"]]
    report = _describe(import_cycles(edges), edges)
    assert "lab_backends/pkg/hidden.py:2 imports lab_backends.lazy (deferred)" in report
    assert "lab_backends/typed.py:3 imports lab_backends.typed (typing)" in report


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


@dataclass(frozen=True)
class Import:
    """One import statement's module: ``name`` as imported (``from a.b import c`` gives ``a.b.c``)."""

    path: str
    line: int
    name: str
    when: str


def _under(name: str, key: str) -> bool:
    return name == key or name.startswith(key + ".")


def module_imports(root: Path = PROJECT_ROOT) -> dict[str, list[Import]]:
    """Every import of every ``lab_backends`` module of ``root``, by importer, relative ones made absolute."""
    paths = {_module_name(p, root): p for p in sorted((root / "lab_backends").rglob("*.py"))}
    found: dict[str, list[Import]] = {}
    for importer, path in paths.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        rel = str(path.relative_to(root))
        rows = found.setdefault(importer, [])

        def visit(node: ast.AST, ancestors: list[ast.AST]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    rows.extend(Import(rel, child.lineno, a.name, _when(ancestors)) for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - (child.level - 1)] + ([base] if base else []))
                    rows.extend(Import(rel, child.lineno, f"{base}.{a.name}", _when(ancestors)) for a in child.names)
                visit(child, [*ancestors, child])

        visit(ast.parse(path.read_text(), str(path)), [])
    return found


def _our_module(name: str, modules: dict[str, list[Import]]) -> str | None:
    """The module of ours that ``name`` imports (``lab_backends.x.f`` -> ``lab_backends.x``), else None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def heavy_chain(module: str, modules: dict[str, list[Import]]) -> list[str] | None:
    """How importing ``module`` of ours imports a ``DEFERRABLE`` package at once: the chain of modules, or None.

    Importing a module runs its parent packages' ``__init__`` first, and then its own top-level imports.
    """
    seen = {module}
    queue = [[module]]
    while queue:
        chain = queue.pop(0)
        parents = [".".join(chain[-1].split(".")[:k]) for k in range(1, chain[-1].count(".") + 1)]
        for name in [i.name for i in modules[chain[-1]] if i.when == "module"] + parents:
            if any(_under(name, key) for key in DEFERRABLE):
                return [*chain, name]
            ours = _our_module(name, modules)
            if ours and ours not in seen:
                seen.add(ours)
                queue.append([*chain, ours])
    return None


def deferred_import_findings(root: Path = PROJECT_ROOT) -> tuple[list[str], set[str]]:
    """(imports inside functions that should be at the top, with file:line and the fix; DEFERRABLE keys used)."""
    modules = module_imports(root)
    problems, used = [], set()
    for imports in modules.values():
        for imp in (i for i in imports if i.when == "deferred"):
            keys = [key for key in DEFERRABLE if _under(imp.name, key)]
            ours = _our_module(imp.name, modules)
            chain = heavy_chain(ours, modules) if ours and not keys else None
            if keys or chain:
                used.update(keys or [k for k in DEFERRABLE if _under(chain[-1], k)])
                continue
            what = "a module of this package that imports nothing heavy at its top" if ours else "a light package"
            problems.append(
                f"{imp.path}:{imp.line} imports {imp.name} inside a function ({what}): move the import to the top "
                "of the module. If it hid an import cycle, move the piece both modules need into a module below "
                "them both (docs/architecture.md); if the package is heavy or optional, add it to DEFERRABLE in "
                "tests/test_architecture.py with the reason, and say why in the module's docstring.")
    return problems, used


def test_imports_are_at_the_top_unless_heavy() -> None:
    problems, _ = deferred_import_findings()
    assert not problems, "imports inside functions:\n" + "\n".join(problems)


def test_every_deferrable_package_is_deferred_somewhere() -> None:
    _, used = deferred_import_findings()
    assert set(DEFERRABLE) <= used, f"DEFERRABLE lists {sorted(set(DEFERRABLE) - used)}, deferred nowhere: remove it"


def test_the_deferred_import_checker(tmp_path: Path) -> None:
    """The checker itself: light imports in a function fail with file:line; heavy ones, direct or through a
    module of ours that imports one at its top (or in its package's ``__init__``), pass."""
    files = {
        "__init__.py": "",
        "plots.py": "import matplotlib.pyplot as plt\n",
        "tables/__init__.py": "import pandas\n",
        "tables/rows.py": "ROWS = 1\n",
        "light.py": "import json\n",
        "user.py": ("def a():\n    import json\n"
                    "def b():\n    from matplotlib.figure import Figure\n"
                    "def c():\n    from lab_backends.plots import plt\n"
                    "def d():\n    from .tables.rows import ROWS\n"
                    "def e():\n    from lab_backends import light\n"
                    "def f():\n    from tritonclient import http\n"
                    "def g():\n    from tritonclient import grpc\n"),
    }
    for name, text in files.items():
        (tmp_path / "lab_backends" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lab_backends" / name).write_text(text)
    problems, used = deferred_import_findings(tmp_path)
    assert [p.split(" inside")[0] for p in problems] == [
        "lab_backends/user.py:2 imports json",
        "lab_backends/user.py:10 imports lab_backends.light",
        "lab_backends/user.py:14 imports tritonclient.grpc",
    ]
    assert "move the import to the top of the module" in problems[0]
    assert used == {"matplotlib", "pandas", "tritonclient.http"}


def private_imports(root: Path = PACKAGE) -> list[str]:
    """``from lab_backends.x import _name``: another module's private name taken by import (a reach-in)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(root.name):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        where = f"{path.relative_to(root.parent)}:{node.lineno}"
                        found.append(f"{where} imports {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = private_imports()
    assert not found, ("private names imported from another module (make the name public with a docstring "
                       "that says who uses it, or move the code):\n" + "\n".join(found))


def test_the_private_import_checker(tmp_path: Path) -> None:
    package = tmp_path / "lab_backends"
    package.mkdir()
    (package / "a.py").write_text("def _hidden():\n    pass\n")
    (package / "b.py").write_text("from lab_backends.a import _hidden\nfrom lab_backends import a as _a\n")
    assert private_imports(package) == ["lab_backends/b.py:1 imports lab_backends.a._hidden"]
