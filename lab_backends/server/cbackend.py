"""Build Triton backends written in C with plain ``gcc``: no CMake, no upstream repositories.

Triton loads a backend named ``<name>`` from ``libtriton_<name>.so`` (or the config's ``runtime``),
searching the model's version folder, the model folder, then ``<backend dir>/<name>/`` - where we
install ours (notebook 09 shows the search on a real server) - and looks its entry points
(``TRITONBACKEND_ModelInstanceExecute`` at least) up by name. Two choices here
turn runtime surprises into build errors:

* the library is linked against the server library bundled in the wheel with ``-Wl,-z,defs``,
  so an API function that does not exist (a typo) is an *undefined reference at build time*
  instead of a model that fails to load later with a terse ``undefined symbol``;
* the sources compile with ``-fvisibility=hidden`` and the header marks the entry points
  ``LAB_EXPORT``; after linking we check that the server will find ``Execute``.

The output is written to a temporary file and renamed into place, so a running server that has the
old library mapped is never handed a half-written file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from lab_backends.errors import BackendBuildError
from lab_backends.paths import BACKEND_DIR, PROJECT_ROOT
from lab_backends.server.bundle import find_bundle

#: Where the C backends live: ``c_backends/<name>/<name>.c``, plus shared headers in ``include/``.
C_BACKENDS_DIR = PROJECT_ROOT / "c_backends"
INCLUDE_DIR = C_BACKENDS_DIR / "include"
#: The entry point Triton insists on; the others are optional.
REQUIRED_ENTRY_POINT = "TRITONBACKEND_ModelInstanceExecute"
#: Custom batching strategies: ``c_backends/batching/<name>/<name>.c``, built beside the backend
#: directory, to ``build/batching/lib<name>.so``.
STRATEGIES_DIR = C_BACKENDS_DIR / "batching"
STRATEGY_DIR = BACKEND_DIR.parent / "batching"
#: A strategy defines all five or none (core src/backend_model.cc:898-911 at r24.10).
STRATEGY_ENTRY_POINTS = (
    "TRITONBACKEND_ModelBatcherInitialize", "TRITONBACKEND_ModelBatcherFinalize",
    "TRITONBACKEND_ModelBatchInitialize", "TRITONBACKEND_ModelBatchIncludeRequest",
    "TRITONBACKEND_ModelBatchFinalize",
)
CFLAGS = ("-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden")


def library_path(name: str, backend_dir: Path = BACKEND_DIR) -> Path:
    """Where we install backend ``name`` (Triton's global place): ``<backend_dir>/<name>/libtriton_<name>.so``."""
    return Path(backend_dir) / name / f"libtriton_{name}.so"


def find_compiler(wanted: str | None = None) -> str:
    """The C compiler to use (``$CC`` or ``gcc``), or a clear error naming how to install one."""
    wanted = wanted or os.environ.get("CC") or "gcc"
    found = shutil.which(wanted)
    if not found:
        raise BackendBuildError(
            f"C compiler '{wanted}' not found on PATH; C backends are built with gcc. Install it "
            "(Debian/Ubuntu: `sudo apt-get install gcc`; conda: `conda install -c conda-forge "
            "gcc`) or set CC to a compiler that exists, then run `lab-backends build-backends`"
        )
    return found


@contextmanager
def built_in_place(target: Path) -> Iterator[Path]:
    """A temporary file beside ``target`` to build into, renamed onto it (mode 0755) when the block succeeds and
    removed in any case: a running server that has the old library mapped is never handed half a file, and
    builds racing for the same target (test workers) each rename a whole one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _server_library() -> Path:
    return find_bundle().server_library()


def exported_symbols(library: str | Path) -> list[str]:
    """The functions a shared library exports: what ``dlsym`` (and so Triton) can find in it.

    Empty when ``nm`` (binutils, installed with gcc) is missing.
    """
    nm = shutil.which("nm")
    if nm is None:
        return []
    result = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendBuildError(f"cannot list the symbols of {library}: {result.stderr.strip()}")
    return sorted(line.split()[-1] for line in result.stdout.splitlines() if line.split()[1:2] == ["T"])


def _check_exports(library: Path, name: str, required: tuple[str, ...] = (REQUIRED_ENTRY_POINT,)) -> None:
    """Fail the build if Triton would not find the required entry points (e.g. left hidden)."""
    if shutil.which("nm") is None:  # without nm we only lose this extra check
        return
    exported = exported_symbols(library)
    missing = [entry for entry in required if entry not in exported]
    if missing:
        what = "backend" if required == (REQUIRED_ENTRY_POINT,) else "batching strategy"
        raise BackendBuildError(
            f"{what} '{name}' built, but {library.name} does not export {', '.join(missing)}, so "
            "Triton could not load it. Define that function (spelled exactly so) in the source and "
            "keep it visible: declare it through lab_triton.h, which marks it LAB_EXPORT"
        )


def build(
    source: str | Path,
    name: str,
    backend_dir: str | Path = BACKEND_DIR,
    *,
    compiler: str | None = None,
    include_dirs: Iterable[str | Path] = (INCLUDE_DIR,),
    extra_flags: Iterable[str] = (),
    target: Path | None = None,
    required: tuple[str, ...] = (REQUIRED_ENTRY_POINT,),
    link_flags: Iterable[str] = (),
    more_sources: Iterable[str | Path] = (),
) -> Path:
    """Compile ``source`` into Triton backend ``name`` and return the library's path.

    Raises :class:`BackendBuildError` quoting the compiler when gcc is missing, the source does not
    compile, or an API name is misspelled (caught at link time by ``-Wl,-z,defs``). ``extra_flags``
    go to gcc after ours (the exercise checker adds ``-Werror``). ``target`` and ``required`` serve
    :func:`build_strategy`: another file name, other entry points that must be exported.
    ``more_sources`` are compiled into the same library after ``source`` (a backend in several files,
    e.g. lab_tensorflow and its batch file; an exercise's file with the rest of its backend).
    ``link_flags`` go after the source (libraries, rpath): a framework's runtime
    (:mod:`lab_backends.server.native_backends`).
    """
    source = Path(source)
    if not source.is_file():
        raise BackendBuildError(f"C source {source} does not exist; backends live in {C_BACKENDS_DIR}/<name>/<name>.c")
    if not name or not name.replace("_", "").isalnum():
        raise BackendBuildError(
            f"backend name {name!r} must be letters, digits and underscores: it becomes the folder "
            "name and the `backend:` value in config.pbtxt"
        )
    cc = find_compiler(compiler)
    server_lib = _server_library()
    target = target if target is not None else library_path(name, Path(backend_dir))
    with built_in_place(target) as tmp:
        command = [
            cc, *CFLAGS, *extra_flags, *(f"-I{d}" for d in include_dirs),
            "-shared", "-o", str(tmp), str(source), *(str(p) for p in more_sources),
            "-Wl,-z,defs",                               # every symbol must resolve now, not at load
            str(server_lib),                             # the API lives in libtritonserver.so
            f"-Wl,-rpath-link,{server_lib.parent}",      # its own dependencies, for the link check only
            *link_flags,
            "-lm",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip()
            hint = ""
            if "undefined reference" in message:
                hint = (
                    "\n  how to fix: an undefined reference names a function that libtritonserver "
                    "does not export - check its spelling against c_backends/include/lab_triton.h"
                )
            what = "backend" if required == (REQUIRED_ENTRY_POINT,) else "batching strategy"
            raise BackendBuildError(
                f"building {what} '{name}' from {source} failed (exit {result.returncode}):\n"
                f"{message}{hint}\n  command: {' '.join(command)}"
            )
        _check_exports(tmp, name, required)
    return target


def sources() -> dict[str, Path]:
    """Backend name -> C source for every ``c_backends/<name>/<name>.c`` in the project."""
    return {
        d.name: d / f"{d.name}.c"
        for d in sorted(C_BACKENDS_DIR.iterdir())
        if d.is_dir() and (d / f"{d.name}.c").is_file()
    }


def outdated(target: Path, inputs: Iterable[Path]) -> bool:
    """True when ``target`` is missing or older than any of ``inputs``: the one staleness rule of every
    library built here (backends, strategies, framework backends, the preload)."""
    if not target.exists():
        return True
    built = target.stat().st_mtime
    return any(p.stat().st_mtime > built for p in inputs)


def is_stale(name: str, source: Path, backend_dir: Path = BACKEND_DIR) -> bool:
    """True when the library is missing or older than its source, a shared header, or the server
    library it links (a reinstalled wheel may rename ``libtritonserver-<hash>.so``)."""
    return outdated(library_path(name, backend_dir), [source, *INCLUDE_DIR.glob("*.h"), _server_library()])


def build_all(backend_dir: str | Path = BACKEND_DIR, force: bool = False) -> dict[str, Path]:
    """Build every C backend whose library is missing or stale (idempotent, used by ``setup``), then
    every batching strategy, beside ``backend_dir`` (``<its parent>/batching/``).

    Returns name -> library path for all of them, built now or already up to date; strategies are
    named ``batching/<name>``.
    """
    backend_dir = Path(backend_dir)
    built: dict[str, Path] = {}
    for name, source in sources().items():
        if force or is_stale(name, source, backend_dir):
            built[name] = build(source, name, backend_dir)
        else:
            built[name] = library_path(name, backend_dir)
    for name, path in build_all_strategies(backend_dir.parent / "batching", force).items():
        built[f"batching/{name}"] = path
    return built


def strategy_path(name: str, strategy_dir: Path = STRATEGY_DIR) -> Path:
    """Where batching strategy ``name`` is built: ``<strategy_dir>/lib<name>.so`` (the absolute path a
    model config names in ``TRITON_BATCH_STRATEGY_PATH``)."""
    return Path(strategy_dir) / f"lib{name}.so"


def build_strategy(source: str | Path, name: str, strategy_dir: str | Path = STRATEGY_DIR, *,
                   extra_flags: Iterable[str] = ()) -> Path:
    """Compile a custom batching strategy (same flags and link check as a backend); its path.

    The library must export all five ``TRITONBACKEND_ModelBatch*`` functions, else the build fails
    (Triton would refuse the load: core src/backend_model.cc:898-911 at r24.10).
    """
    return build(source, name, extra_flags=extra_flags, target=strategy_path(name, Path(strategy_dir)),
                 required=STRATEGY_ENTRY_POINTS)


def strategy_sources() -> dict[str, Path]:
    """Strategy name -> C source for every ``c_backends/batching/<name>/<name>.c``."""
    if not STRATEGIES_DIR.is_dir():
        return {}
    return {d.name: d / f"{d.name}.c" for d in sorted(STRATEGIES_DIR.iterdir()) if (d / f"{d.name}.c").is_file()}


def build_all_strategies(strategy_dir: str | Path = STRATEGY_DIR, force: bool = False) -> dict[str, Path]:
    """Build every batching strategy whose library is missing or stale (set-up does, after the backends)."""
    built: dict[str, Path] = {}
    for name, source in strategy_sources().items():
        target = strategy_path(name, Path(strategy_dir))
        if force or outdated(target, [source, *INCLUDE_DIR.glob("*.h"), _server_library()]):
            build_strategy(source, name, strategy_dir)
        built[name] = target
    return built
