"""Build the framework backends of ``c_backends/frameworks/``: a framework's own runtime behind the backend C API.

``lab_tensorflow`` (``c_backends/frameworks/lab_tensorflow/``, C: ``lab_tensorflow.c`` and its gather and
scatter in ``lab_tensorflow_batch.c``, sharing ``lab_tensorflow.h``) serves a TensorFlow SavedModel
inside the server process through TensorFlow's C API, the way Triton's own framework backends
(tensorflow_backend, pytorch_backend ``src/libtorch.cc``) do in C++: gather the batch into one
framework tensor, run it once, scatter the rows. Its build is a C backend's build
(:func:`lab_backends.server.cbackend.build`: ``gcc -Wall -Wextra -Werror``, ``-fvisibility=hidden``,
``-Wl,-z,defs`` against the wheel's ``libtritonserver``) plus what a framework needs:

* TensorFlow's C headers and libraries, found in the installed ``tensorflow-cpu`` wheel
  (``tensorflow/include/tensorflow/c/c_api.h``, ``libtensorflow_cc.so.2`` which exports the ``TF_*``
  functions, and ``libtensorflow_framework.so.2``). The package is located with
  :func:`importlib.util.find_spec`, never imported: importing TensorFlow takes seconds and ~700 MB;
* the libraries on the link line, so that ``-Wl,-z,defs`` also catches a misspelled ``TF_*`` name;
* an rpath to the wheel's folder: Triton ``dlopen``\\s our library, which must then find
  TensorFlow's without ``LD_LIBRARY_PATH``.

Stale-checked like the other C backends (set-up rebuilds only when a source, a shared header, the
server library or TensorFlow's libraries are newer than the built library). The sources under
``c_backends/frameworks/`` are not picked up by ``cbackend.build_all``: it knows no framework flags.

``lab_libtorch`` (``c_backends/frameworks/lab_libtorch/``, C++) serves a TorchScript file through the
``torch`` wheel's libtorch, the same loop. libtorch's API is C++ only, so it is built with ``g++``:
``-std=c++20`` (torch 2.13's headers need it), ``-D_GLIBCXX_USE_CXX11_ABI`` as the wheel was built (asked
of ``torch._C`` in a child interpreter, only when a build is due: importing torch costs seconds and
hundreds of MB), torch's two include folders as *system* headers (``-isystem``: ``-Wall -Wextra
-Werror`` judge our code, not theirs), ``libtorch_cpu.so`` and ``libc10.so`` on the link line and an
rpath to ``torch/lib``. Measured here: 11-15 s of g++ (torch's headers are most of it) plus ~3 s to ask
torch its ABI, once; a stale check costs under a millisecond.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lab_backends.errors import BackendBuildError
from lab_backends.paths import BACKEND_DIR
from lab_backends.server import cbackend
from lab_backends.server.bundle import find_bundle

FRAMEWORKS_DIR = cbackend.C_BACKENDS_DIR / "frameworks"
#: lab_framework_steps.h: the steps the C++ framework backends share (lab_libtorch, lab_kvcache, lab_executorch).
FRAMEWORK_INCLUDE_DIR = FRAMEWORKS_DIR / "include"
TENSORFLOW_BACKEND = "lab_tensorflow"
#: The C API's header, relative to the wheel's include folder, and the libraries that export it.
TENSORFLOW_HEADER = Path("tensorflow") / "c" / "c_api.h"
TENSORFLOW_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")
LIBTORCH_BACKEND = "lab_libtorch"
#: A header that only a wheel with libtorch's C++ API has, relative to torch/include.
LIBTORCH_HEADER = Path("torch") / "script.h"
#: torch/include and the C++ API's own root (``#include <torch/script.h>`` resolves there).
LIBTORCH_INCLUDES = (Path("."), Path("torch") / "csrc" / "api" / "include")
#: libtorch_cpu exports the tensor and TorchScript functions, libc10 the core types (c10::Error ...).
LIBTORCH_LIBRARIES = ("libtorch_cpu.so", "libc10.so")
CXXFLAGS = ("-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden")


@dataclass(frozen=True)
class FrameworkRuntime:
    """A framework's C/C++ runtime as an installed wheel ships it: what gcc needs to build against it."""

    package: str
    root: Path                    # the package folder in site-packages
    include_dir: Path
    libraries: tuple[Path, ...]

    def link_flags(self) -> tuple[str, ...]:
        """The libraries by full file name (``-l:``: the wheel has no ``libX.so`` link names), and an
        rpath to their folder so that the server's ``dlopen`` of our backend finds them.

        GNU gold links when binutils has it (:func:`faster_linker`): measured here, ld.bfd took 8.2 s
        (900 MB) to link lab_tensorflow against ``libtensorflow_cc.so.2``, gold 1.6 s (370 MB), with the
        same ``-z defs`` verdicts. The exercise of notebook 09c links each answer it judges."""
        folders = sorted({str(lib.parent) for lib in self.libraries})
        return (
            *faster_linker(),
            *(f"-L{folder}" for folder in folders),
            *(f"-l:{lib.name}" for lib in self.libraries),
            *(f"-Wl,-rpath,{folder}" for folder in folders),
        )


def faster_linker() -> tuple[str, ...]:
    """``-fuse-ld=gold`` when binutils' gold is installed (Debian's binutils ships it), else nothing:
    gcc's default linker, slower on the frameworks' large libraries but just as strict."""
    return ("-fuse-ld=gold",) if shutil.which("ld.gold") else ()


def tensorflow_runtime() -> FrameworkRuntime:
    """TensorFlow's C API in the installed ``tensorflow-cpu`` wheel, or a clear error saying how to get it."""
    spec = importlib.util.find_spec("tensorflow")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise BackendBuildError(
            "backend 'lab_tensorflow' needs TensorFlow's C API from the tensorflow-cpu wheel, which is not "
            "installed in this environment; install the project's dependencies (`make setup`, or "
            "`pip install tensorflow-cpu==2.21.0`), then run `lab-backends build-backends`"
        )
    root = Path(locations[0]).resolve()
    include_dir = root / "include"
    libraries = tuple(root / name for name in TENSORFLOW_LIBRARIES)
    missing = [str(p) for p in (include_dir / TENSORFLOW_HEADER, *libraries) if not p.is_file()]
    if missing:
        raise BackendBuildError(
            f"the TensorFlow package at {root} lacks {', '.join(missing)}: backend 'lab_tensorflow' needs the "
            "C API that the tensorflow-cpu wheel ships; reinstall it (`pip install --force-reinstall "
            "tensorflow-cpu==2.21.0`)"
        )
    return FrameworkRuntime("tensorflow", root, include_dir, libraries)


def tensorflow_source() -> Path:
    """lab_tensorflow's loading and Execute; its gather and scatter are :func:`tensorflow_batch_source`."""
    return FRAMEWORKS_DIR / TENSORFLOW_BACKEND / f"{TENSORFLOW_BACKEND}.c"


def tensorflow_batch_source() -> Path:
    """lab_tensorflow's gather() and scatter(), a file of their own: notebook 09c's exercise asks for
    them, and its checker builds the learner's file with :func:`tensorflow_source` in its place
    (:mod:`lab_backends.lessons.native_exercise`). This file is the exercise's reference answer."""
    return FRAMEWORKS_DIR / TENSORFLOW_BACKEND / f"{TENSORFLOW_BACKEND}_batch.c"


def tensorflow_is_stale(backend_dir: Path = BACKEND_DIR, runtime: FrameworkRuntime | None = None) -> bool:
    """True when the library is missing or older than any file of its source folder (its local
    headers included), a shared header, the server library or TensorFlow's libraries."""
    target = cbackend.library_path(TENSORFLOW_BACKEND, Path(backend_dir))
    if not target.exists():  # before the runtime is looked up (cbackend.outdated would say the same)
        return True
    runtime = runtime or tensorflow_runtime()
    inputs = [*tensorflow_source().parent.iterdir(), *cbackend.INCLUDE_DIR.glob("*.h"),
              find_bundle().server_library(), *runtime.libraries]
    return cbackend.outdated(target, (p for p in inputs if p.is_file()))


def build_tensorflow(backend_dir: str | Path = BACKEND_DIR, *, force: bool = False) -> Path:
    """Build ``lab_tensorflow`` into ``<backend_dir>/lab_tensorflow/libtriton_lab_tensorflow.so`` when
    stale (or ``force``); its path. Raises :class:`BackendBuildError` quoting gcc on failure."""
    backend_dir = Path(backend_dir)
    runtime = tensorflow_runtime()
    if not force and not tensorflow_is_stale(backend_dir, runtime):
        return cbackend.library_path(TENSORFLOW_BACKEND, backend_dir)
    return cbackend.build(
        tensorflow_source(), TENSORFLOW_BACKEND, backend_dir,
        include_dirs=(cbackend.INCLUDE_DIR, runtime.include_dir),
        link_flags=runtime.link_flags(), more_sources=(tensorflow_batch_source(),),
    )


# ---------------------------------------------------------------------------------- libtorch (C++)
def libtorch_runtime() -> FrameworkRuntime:
    """libtorch in the installed ``torch`` wheel (headers and libraries), or a clear error saying how to get it."""
    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise BackendBuildError(
            "backend 'lab_libtorch' needs libtorch from the torch wheel, which is not installed in this "
            "environment; install the project's dependencies (`make setup`), then run `lab-backends build-backends`"
        )
    root = Path(locations[0]).resolve()
    include_dir = root / "include"
    libraries = tuple(root / "lib" / name for name in LIBTORCH_LIBRARIES)
    missing = [str(p) for p in (include_dir / LIBTORCH_HEADER, *libraries) if not p.is_file()]
    if missing:
        raise BackendBuildError(
            f"the torch package at {root} lacks {', '.join(missing)}: backend 'lab_libtorch' needs the headers "
            "and libraries that the torch wheel ships; reinstall it (`pip install --force-reinstall torch`)"
        )
    return FrameworkRuntime("torch", root, include_dir, libraries)


def libtorch_source() -> Path:
    return FRAMEWORKS_DIR / LIBTORCH_BACKEND / f"{LIBTORCH_BACKEND}.cc"


def libtorch_inputs(runtime: FrameworkRuntime) -> list[Path]:
    """What the library is made from: its folder, the JSON scanner it shares with lab_tensorflow, the
    shared headers (C and the frameworks' C++), the server library, libtorch's libraries."""
    return [*libtorch_source().parent.iterdir(), FRAMEWORKS_DIR / TENSORFLOW_BACKEND / "config_json.h",
            *cbackend.INCLUDE_DIR.glob("*.h"), *FRAMEWORK_INCLUDE_DIR.glob("*.h"), find_bundle().server_library(),
            *runtime.libraries]


def libtorch_is_stale(backend_dir: Path = BACKEND_DIR, runtime: FrameworkRuntime | None = None) -> bool:
    """True when the library is missing or older than any of :func:`libtorch_inputs`."""
    target = cbackend.library_path(LIBTORCH_BACKEND, Path(backend_dir))
    if not target.exists():  # before the runtime is looked up (cbackend.outdated would say the same)
        return True
    return cbackend.outdated(target, (p for p in libtorch_inputs(runtime or libtorch_runtime()) if p.is_file()))


def cxx11_abi() -> int:
    """The ``_GLIBCXX_USE_CXX11_ABI`` value torch was built with: std::string and friends must have the
    same layout on both sides of every call into libtorch. Asked of a child interpreter (see above)."""
    result = subprocess.run([sys.executable, "-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or result.stdout.strip() not in ("0", "1"):
        raise BackendBuildError(f"cannot ask torch for its C++ ABI: {(result.stderr or result.stdout).strip()[-400:]}")
    return int(result.stdout.strip())


def libtorch_command(runtime: FrameworkRuntime, output: Path, abi: int, compiler: str = "g++") -> list[str]:
    """The g++ line: our warnings as errors, torch's headers as system headers, the link checked."""
    server_lib = find_bundle().server_library()
    return [
        compiler, *CXXFLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{cbackend.INCLUDE_DIR}",
        f"-I{FRAMEWORK_INCLUDE_DIR}",
        *(f"-isystem{(runtime.include_dir / sub).resolve()}" for sub in LIBTORCH_INCLUDES),
        "-shared", "-o", str(output), str(libtorch_source()),
        "-Wl,-z,defs", str(server_lib), f"-Wl,-rpath-link,{server_lib.parent}",
        *runtime.link_flags(),
    ]


def build_libtorch(backend_dir: str | Path = BACKEND_DIR, *, force: bool = False) -> Path:
    """Build ``lab_libtorch`` into ``<backend_dir>/lab_libtorch/libtriton_lab_libtorch.so`` when stale (or
    ``force``); its path. Raises :class:`BackendBuildError` quoting g++ on failure. Written to a
    temporary name and renamed, as cbackend.build does: a running server never maps half a file."""
    backend_dir = Path(backend_dir)
    runtime = libtorch_runtime()
    target = cbackend.library_path(LIBTORCH_BACKEND, backend_dir)
    if not force and not libtorch_is_stale(backend_dir, runtime):
        return target
    return build_cxx(LIBTORCH_BACKEND, libtorch_source(), target,
                     lambda tmp, compiler: libtorch_command(runtime, tmp, cxx11_abi(), compiler))


def build_cxx(name: str, source: Path, target: Path, command: Callable[[Path, str], list[str]],
              framework: str = "libtorch") -> Path:
    """Compile a C++ backend with ``command(temporary output, g++)`` into ``target``: written to a
    temporary name and renamed (cbackend.built_in_place), g++'s words quoted on failure, the entry point
    checked. One place for lab_libtorch, lab_kvcache (kv_backend.py) and lab_executorch
    (executorch_backend.py): C++ because their ``framework`` has no C API."""
    compiler = shutil.which(os.environ.get("CXX") or "g++")
    if compiler is None:
        raise BackendBuildError(
            f"C++ compiler g++ not found on PATH; backend '{name}' is C++ ({framework} has no C API). "
            "Install it (Debian/Ubuntu: `sudo apt-get install g++`) or set CXX, then run `lab-backends build-backends`"
        )
    with cbackend.built_in_place(target) as tmp:
        line = command(tmp, compiler)
        result = subprocess.run(line, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise BackendBuildError(
                f"building backend '{name}' from {source} failed (exit {result.returncode}):\n"
                f"{(result.stderr or result.stdout).strip()[-6000:]}\n  command: {' '.join(line)}"
            )
        exported = cbackend.exported_symbols(tmp)  # empty without nm: then this extra check is skipped
        if exported and cbackend.REQUIRED_ENTRY_POINT not in exported:
            raise BackendBuildError(f"backend '{name}' built, but does not export "
                                    f"{cbackend.REQUIRED_ENTRY_POINT}: keep its extern \"C\" block")
    return target


def build_all(backend_dir: str | Path = BACKEND_DIR, force: bool = False) -> dict[str, Path]:
    """Every framework backend, built when stale (set-up calls this after the plain C backends)."""
    return {TENSORFLOW_BACKEND: build_tensorflow(backend_dir, force=force),
            LIBTORCH_BACKEND: build_libtorch(backend_dir, force=force)}
