"""What the project imports is what it declares; the client pin and the conda files follow pyproject.toml.

Every third-party module imported by the package, the models, the notebooks' code cells, the tests and
the scripts maps (through the installed distributions) to a requirement in pyproject.toml: the package,
the models and the notebooks to ``[project] dependencies``, the test side to those plus the ``test``
extra that ``make test`` installs. A module that comes along only as someone else's dependency today
(``nbformat``, ``grpc``, ``google.protobuf`` used to) fails here, with the file that imports it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Imported, but no pip distribution provides it (and none should be declared for it).
NOT_FROM_PIP = {
    "triton_python_backend_utils": "the Python backend's own module: the server puts it on the stub's path",
    "executorch": "pinned in lab_backends/digits/executorch_env.py and installed into build/executorch-venv (it needs "
                  "numpy 2), never into the project's venv; only export_et.py, run by that venv's Python, imports it",
}

#: Files that run only under pytest (or drive it): they may also import the `test` extra.
TEST_SIDE = {
    "tests/": "the test suite",
    "scripts/": "developer scripts that run pytest/nbval (make flake, footprints, GPU checks)",
    "notebooks/conftest.py": "nbval's conftest",
    "lab_backends/book/capture.py": "a pytest hook, loaded only by notebooks/conftest.py under nbval",
}

#: The test tools: in the `test` extra, never in the runtime dependencies.
TEST_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "nbval", "check-jsonschema", "kubernetes-validate",
              "playwright", "ruff"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"unparsable requirement {requirement!r}"
    return _canonical(match.group(1))


def _normalize(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


CORE = PYPROJECT["project"]["dependencies"]
TEST_EXTRA = PYPROJECT["project"].get("optional-dependencies", {}).get("test", [])
#: `make class` (and `make test`, for tests/class) installs it: JupyterHub, imported by lab_backends/classroom/ only.
CLASS_EXTRA = PYPROJECT["project"].get("optional-dependencies", {}).get("class", [])
CLASS_SIDE = "lab_backends/classroom/"


def _project_files() -> list[Path]:
    """Tracked and new (not ignored) files: what a clone of the project holds."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py", "*.ipynb"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if out.returncode == 0:
        return sorted({ROOT / f for f in out.stdout.splitlines() if (ROOT / f).is_file()})
    skip = {".venv", "build", ".git", "runs", "node_modules"}
    return sorted(p for ext in ("*.py", "*.ipynb") for p in ROOT.rglob(ext)
                  if not skip & set(p.relative_to(ROOT).parts))


def _source(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # IPython magics and shell escapes are not Python.
    return "\n".join("\n".join(ln for ln in c.splitlines() if not ln.lstrip().startswith(("%", "!", "?")))
                     for c in code)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(_source(path), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _is_local(top: str, path: Path) -> bool:
    """The project's own modules: the package, `tests`, and a script's or test's sibling modules."""
    return any((folder / top).is_dir() or (folder / f"{top}.py").is_file()
               for folder in (ROOT, ROOT / "tests", path.parent))


def _import_key(module: str) -> str:
    """The name a distribution owns: the top level, or two levels in the `google` namespace."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "google" and len(parts) > 1 else parts[0]


def third_party_imports() -> dict[str, set[str]]:
    """{import key: the project files (relative) that import it}."""
    found: dict[str, set[str]] = {}
    for path in _project_files():
        for module in _imports(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__" or _is_local(top, path):
                continue
            found.setdefault(_import_key(module), set()).add(path.relative_to(ROOT).as_posix())
    return found


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(key: str) -> str | None:
    """The installed distribution that provides the module ``key`` (None when nothing installed does)."""
    top = key.split(".")[0]
    candidates = sorted(set(_packages_distributions().get(top, [])))
    if len(candidates) == 1:
        return _canonical(candidates[0])
    prefix = key.replace(".", "/")
    for dist in candidates:  # a namespace package shared by several distributions (google.*)
        files = importlib.metadata.distribution(dist).files or []
        if any(str(f).startswith(prefix + "/") or str(f) == prefix + ".py" for f in files):
            return _canonical(dist)
    return None


def _test_side(relpath: str) -> bool:
    return any(relpath == side or (side.endswith("/") and relpath.startswith(side)) for side in TEST_SIDE)


def test_the_scan_sees_the_project() -> None:
    """A scan that reads nothing would pass everything: it must see the known imports."""
    found = third_party_imports()
    assert {"numpy", "torch", "tritonclient", "pytest", "google.protobuf", "grpc", "nbformat"} <= set(found)
    assert "lab_backends" not in found and "tests" not in found
    assert any(f.endswith(".ipynb") for f in found["tritonclient"]), "notebook code cells are scanned"
    assert any(f.startswith("model_repository/") for f in found["numpy"]), "model.py files are scanned"


def test_every_third_party_import_is_declared() -> None:
    core = {_requirement_name(r) for r in CORE}
    test = {_requirement_name(r) for r in TEST_EXTRA}
    hub = {_requirement_name(r) for r in CLASS_EXTRA}
    problems = []
    for key, files in sorted(third_party_imports().items()):
        if key in NOT_FROM_PIP:
            continue
        dist = distribution_of(key)
        if dist is None:
            problems.append(f"{key}: no installed distribution provides it (imported by {sorted(files)[:3]})")
            continue
        runtime = sorted(f for f in files if not _test_side(f))
        if runtime and dist in hub and all(f.startswith(CLASS_SIDE) for f in runtime):
            continue  # the class's hub side: installed by the `class` extra with JupyterHub
        if runtime and dist not in core:
            where = "only in the `test` extra" if dist in test else "nowhere"
            problems.append(f"{key} ({dist}): imported at run time by {runtime[:3]}, declared {where}; "
                            "add it to [project] dependencies")
        elif not runtime and dist not in core | test:
            problems.append(f"{key} ({dist}): imported by {sorted(files)[:3]}, declared nowhere; "
                            "add it to the `test` extra (or the dependencies)")
    assert not problems, "\n".join(problems)


def test_tritonclient_is_pinned_with_grpc_and_http_only() -> None:
    (req,) = [r for r in CORE if _requirement_name(r) == "tritonclient"]
    match = re.fullmatch(r"tritonclient\[([a-z,\s]+)\]\s*==\s*([0-9.]+)", req.strip())
    assert match, f"{req!r}: pin it exactly (==) with explicit extras, e.g. tritonclient[grpc,http]==X.Y.Z"
    extras = {e.strip() for e in match.group(1).split(",")}
    assert extras == {"grpc", "http"}, f"{extras}: [all] adds cuda-python and the perf-analyzer placeholder"
    assert importlib.metadata.version("tritonclient") == match.group(2), (
        "the environment's tritonclient is not the pinned one: re-run `make setup`")


def test_the_asyncio_clients_import() -> None:
    """tritonclient.http.aio needs aiohttp (the [http] extra brings it); grpc.aio needs grpcio."""
    import tritonclient.grpc
    import tritonclient.grpc.aio
    import tritonclient.http
    import tritonclient.http.aio  # noqa: F401

    assert distribution_of("aiohttp") == "aiohttp"


def test_protobuf_fits_the_client() -> None:
    """tritonclient 2.73's generated code needs protobuf 6 (2.51's needed <5: see pyproject.toml)."""
    (req,) = [r for r in CORE if _requirement_name(r) == "protobuf"]
    assert "<7" in _normalize(req)
    major = int(importlib.metadata.version("protobuf").split(".")[0])
    assert major == 6, f"protobuf {importlib.metadata.version('protobuf')} installed; {req} declared"


def test_test_tools_are_an_extra_not_runtime_dependencies() -> None:
    core = {_requirement_name(r) for r in CORE}
    test = {_requirement_name(r) for r in TEST_EXTRA}
    assert TEST_TOOLS <= test, f"missing from the test extra: {sorted(TEST_TOOLS - test)}"
    assert not TEST_TOOLS & core, f"test tools among the runtime dependencies: {sorted(TEST_TOOLS & core)}"


def test_every_test_tool_is_pinned_and_installed_at_its_pin() -> None:
    """A new pytest, ruff (new rules) or hypothesis release must not change a run by itself: pin each one (==)."""
    problems = []
    for req in TEST_EXTRA:
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", _normalize(req))
        if not match:
            problems.append(f"{req!r}: pin it exactly, e.g. {_requirement_name(req)}==X.Y.Z (the version `make test` "
                            "installed: `.venv/bin/pip show " + _requirement_name(req) + "`)")
            continue
        installed = importlib.metadata.version(match.group(1))
        if installed != match.group(2):
            problems.append(f"{req}: {installed} is installed; re-run `make setup EXTRAS=test`")
    assert not problems, "the `test` extra in pyproject.toml:\n" + "\n".join(problems)


@pytest.mark.parametrize("env_file", ["environment.yml", "environment-gpu.yml"])
def test_conda_files_carry_the_same_pins(env_file: str) -> None:
    """The conda environments are the runtime dependencies, pins and all (the GPU file swaps onnxruntime)."""
    deps = yaml.safe_load((ROOT / env_file).read_text())["dependencies"]
    pip = [_normalize(r) for r in next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)]
    for req in map(_normalize, CORE):
        if re.search(r"[=<>~!]", req) or "[" in req:
            assert req in pip, f"{env_file} lacks {req} exactly as pyproject.toml declares it"
    assert not TEST_TOOLS & {_requirement_name(r) for r in pip}, f"{env_file}: test tools belong to .[test]"
    assert ".[test]" in (ROOT / env_file).read_text(), f"{env_file} should say how to add the test tools"


def _dry_run(*args: str) -> str:
    out = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return "\n".join(ln for ln in out.stdout.splitlines() if "pip install" in ln and "--upgrade pip" not in ln)


def test_make_test_installs_the_test_extra_and_make_lab_does_not() -> None:
    assert "-e '.[test,class]'" in _dry_run("test")  # tests/class need JupyterHub
    assert "-e '.[test,class]'" in _dry_run("flake")
    assert "-e '.[class]'" in _dry_run("class", "VENV=build/no-venv")  # a fresh one (make test's: test_class_make.py)
    lab = _dry_run("lab")
    assert "-e '.'" in lab and "[test]" not in lab and "--extra-index-url" not in lab


def test_a_torch_index_can_be_given_and_the_readme_says_how() -> None:
    url = "https://download.pytorch.org/whl/cpu"
    assert f"--extra-index-url {url}" in _dry_run("lab", f"TORCH_INDEX_URL={url}")
    readme = (ROOT / "README.md").read_text()
    assert f"TORCH_INDEX_URL={url}" in readme, "the README gives the CPU-only route"
