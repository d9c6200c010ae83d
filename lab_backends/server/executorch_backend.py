"""Build ``lab_executorch`` (``c_backends/frameworks/lab_executorch/``): ExecuTorch's C++ runtime behind Triton.

ExecuTorch has no C API and no Triton backend upstream; its runtime ships in the ``executorch`` wheel
(``executorch/lib/libexecutorch*.so``, ``executorch/include/``), which lives in the ExecuTorch build
environment (:mod:`lab_backends.digits.executorch_env`: the project's venv keeps numpy < 2, the
export needs numpy 2). The build is lab_libtorch's (``g++``, our warnings as errors, the framework's
headers as system headers, ``-Wl,-z,defs`` against ``libtritonserver``) with what ExecuTorch needs:

* ``-std=c++17`` and the definitions the wheel's libraries were built with, as its
  ``share/cmake/executorch-config.cmake`` lists them (``EXECUTORCH_COMPILE_DEFINITIONS``):
  ``ET_EVENT_TRACER_ENABLED`` changes inline code of the headers (``BackendInitContext``'s constructor in
  ``runtime/backend/backend_init_context.h``, the hooks of ``runtime/core/event_tracer_hooks_delegate.h``),
  which must be compiled as the libraries were; ``C10_USING_CUSTOM_GENERATED_MACROS`` keeps c10's
  ``Export.h`` from including ``cmake_macros.h``, which the wheel does not ship;
* ``include/executorch/runtime/core/portable_type/c10`` on the include path (the headers include
  ``c10/...`` from there);
* ``-Wl,--no-as-needed`` before the kernel and XNNPACK libraries: we call none of their functions,
  they register their kernels and the XNNPACK delegate from static constructors when loaded, and a
  linker that drops unreferenced libraries (``--as-needed``, the default of some distributions' gcc)
  would leave them out: linked so here, only libexecutorch and libexecutorch_threadpool stayed NEEDED,
  and the program's XNNPACK delegate would find no registered backend;
* the four libraries copied next to ours and an rpath of ``$ORIGIN``. Why not an rpath into the
  venv, as lab_libtorch does into torch/lib: the venv is a build tool (741 MB, numpy 2, rebuilt when
  its pins change), while the backend folder is what a server, a container mount or a class's
  read-only build/ serves; 14 MB of libraries beside the backend keep it whole on its own.
  The libraries' own RUNPATH starts with ``$ORIGIN`` too, so they find each other there.

Stale-checked like the other framework backends: rebuilt when a source, a shared header, the server
library or the venv's ExecuTorch libraries are newer than the built library. Measured here: ~10 s of
g++ for the two sources and the copy (the runtime's headers are light), once.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from lab_backends.built import copy_if_stale
from lab_backends.digits import executorch_env
from lab_backends.errors import BackendBuildError
from lab_backends.paths import BACKEND_DIR
from lab_backends.server import cbackend, native_backends
from lab_backends.server.bundle import find_bundle
from lab_backends.server.native_backends import FRAMEWORK_INCLUDE_DIR, FRAMEWORKS_DIR, TENSORFLOW_BACKEND

NAME = "lab_executorch"
SOURCE_DIR = FRAMEWORKS_DIR / NAME
#: What the wheel's libraries were compiled with (executorch-config.cmake, EXECUTORCH_COMPILE_DEFINITIONS).
DEFINES = ("-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED")
CXXFLAGS = ("-std=c++17", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden")
#: The runtime (Program, Method, data loaders), then what registers itself when loaded: the optimized
#: kernels, the XNNPACK delegate, and the thread pool both use.
LIBRARIES = ("libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_backend_xnnpack.so",
             "libexecutorch_threadpool.so")


def main_source() -> Path:
    """Triton's side: config, requests, gather, scatter, statistics."""
    return SOURCE_DIR / f"{NAME}.cc"


def binding_source() -> Path:
    """The runtime's side (notebook 09d's exercise; this file is its reference answer)."""
    return SOURCE_DIR / f"{NAME}_binding.cc"


def runtime_dir() -> Path:
    """The installed ``executorch`` package of the build environment, made when missing."""
    executorch_env.ensure_venv()
    root = executorch_env.runtime_root()
    needed = (root / "include" / "executorch", *(root / "lib" / n for n in LIBRARIES))
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise BackendBuildError(f"the executorch package at {root} lacks {', '.join(missing)}; remove "
                                f"{executorch_env.VENV_DIR} and run `lab-backends setup` to make it again")
    return root


def inputs(root: Path) -> list[Path]:
    """What the library is made from: its folder, the JSON scanner, the shared headers (C and the
    frameworks' C++), the server library, ExecuTorch's libraries."""
    return [*SOURCE_DIR.iterdir(), FRAMEWORKS_DIR / TENSORFLOW_BACKEND / "config_json.h",
            *cbackend.INCLUDE_DIR.glob("*.h"), *FRAMEWORK_INCLUDE_DIR.glob("*.h"), find_bundle().server_library(),
            *(root / "lib" / n for n in LIBRARIES)]


def is_stale(backend_dir: Path = BACKEND_DIR) -> bool:
    target = cbackend.library_path(NAME, Path(backend_dir))
    if not target.exists() or any(not (target.parent / n).exists() for n in LIBRARIES):
        return True
    return cbackend.outdated(target, (p for p in inputs(runtime_dir()) if p.is_file()))


def compile_flags(root: Path, compiler: str = "g++", extra_flags: tuple[str, ...] = ()) -> list[str]:
    include = root / "include"
    return [compiler, *CXXFLAGS, *DEFINES, *extra_flags, f"-I{cbackend.INCLUDE_DIR}", f"-I{FRAMEWORK_INCLUDE_DIR}",
            f"-I{SOURCE_DIR}", f"-isystem{include}",
            f"-isystem{include / 'executorch' / 'runtime' / 'core' / 'portable_type' / 'c10'}"]


def command(root: Path, output: Path, binding: Path | None = None, compiler: str = "g++",
            extra_flags: tuple[str, ...] = (), main: Path | None = None) -> list[str]:
    """The g++ line; ``binding`` replaces the reference binding (the exercise builds the learner's), ``main``
    is lab_executorch.cc already compiled with the same flags (:func:`main_object`)."""
    server_lib = find_bundle().server_library()
    lib = root / "lib"
    return [
        *compile_flags(root, compiler, extra_flags),
        "-shared", "-o", str(output), str(main or main_source()), str(binding or binding_source()),
        "-Wl,-z,defs", str(server_lib), f"-Wl,-rpath-link,{server_lib.parent}",
        f"-L{lib}", "-Wl,--no-as-needed", *(f"-l:{n}" for n in LIBRARIES), "-Wl,--as-needed",
        "-Wl,-rpath,$ORIGIN",
    ]


def main_object(root: Path, compiler: str, extra_flags: tuple[str, ...], cache_dir: Path) -> Path:
    """lab_executorch.cc compiled once per set of flags and sources, kept in ``cache_dir``: the exercise's
    checker builds one answer after another with the same rest of the backend (4 s of g++ each, saved).
    The name holds a digest of the command and of every input's size and time, so a changed source or
    flag compiles anew; written to a temporary name and renamed (audit workers may race for it)."""
    line = compile_flags(root, compiler, extra_flags)
    sources = [p for p in (main_source(), *SOURCE_DIR.glob("*.h"),
                           FRAMEWORKS_DIR / TENSORFLOW_BACKEND / "config_json.h", *cbackend.INCLUDE_DIR.glob("*.h"),
                           *FRAMEWORK_INCLUDE_DIR.glob("*.h"))
               if p.is_file()]
    digest = hashlib.sha256(json.dumps([line, [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sources]])
                            .encode()).hexdigest()[:16]
    target = Path(cache_dir) / f"{NAME}-{digest}.o"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    result = subprocess.run([*line, "-c", str(main_source()), "-o", str(tmp)], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BackendBuildError(f"compiling {main_source()} failed: {(result.stderr or result.stdout).strip()[-3000:]}")
    os.replace(tmp, target)
    return target


def copy_runtime(root: Path, folder: Path) -> None:
    """ExecuTorch's libraries beside the backend (see the module docstring), each renamed into place."""
    for name in LIBRARIES:
        copy_if_stale(root / "lib" / name, folder / name)


def build(backend_dir: str | Path = BACKEND_DIR, *, force: bool = False, binding: Path | None = None,
          extra_flags: tuple[str, ...] = (), name: str = NAME, cache_dir: Path | None = None) -> Path:
    """Build ``<backend_dir>/lab_executorch/libtriton_lab_executorch.so`` when stale (or ``force``, or with
    another ``binding``: notebook 09d's checker builds the learner's as backend ``name``, the rest compiled
    once into ``cache_dir``); its path. Raises :class:`BackendBuildError` quoting g++ on failure."""
    backend_dir = Path(backend_dir)
    target = cbackend.library_path(name, backend_dir)
    if not force and binding is None and not extra_flags and name == NAME and not is_stale(backend_dir):
        return target
    root = runtime_dir()
    copy_runtime(root, target.parent)

    def line(output: Path, compiler: str) -> list[str]:
        main = main_object(root, compiler, extra_flags, cache_dir) if cache_dir is not None else None
        return command(root, output, binding, compiler, extra_flags, main)

    return native_backends.build_cxx(name, binding or binding_source(), target, line, framework="ExecuTorch")


def build_all(backend_dir: str | Path = BACKEND_DIR, force: bool = False) -> dict[str, Path]:
    """Set-up's library step: {} when ``LAB_SKIP_EXECUTORCH`` is set (lesson 09d skipped)."""
    if executorch_env.skipped():
        return {}
    return {NAME: build(backend_dir, force=force)}
