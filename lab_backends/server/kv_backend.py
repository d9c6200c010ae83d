"""Build ``lab_kvcache`` (``c_backends/frameworks/lab_kvcache/lab_kvcache.cc``): the kvlm transformer served
in C++ over libtorch with a paged (or contiguous) KV cache, behind generate_kv_paged, generate_kv_contiguous
and generate_kv_recompute (notebook 08c, issue 48).

It is built exactly as ``lab_libtorch`` is (:mod:`lab_backends.server.native_backends`: g++ with our
warnings as errors, torch's headers as system headers, the C++ ABI torch was built with, ``-Wl,-z,defs``
against the wheel's ``libtritonserver``, ``libtorch_cpu``/``libc10`` and an rpath to ``torch/lib``), from
its own source: the g++ line is native_backends', with this source in place of lab_libtorch's.
Stale-checked the same way (the source folder, the JSON scanner it shares with lab_tensorflow, the shared
headers, the server library, libtorch's libraries); a fresh check costs under a millisecond, a build
~15-25 s of g++ plus ~3 s to ask torch its ABI.
"""

from __future__ import annotations

from pathlib import Path

from lab_backends.paths import BACKEND_DIR
from lab_backends.server import cbackend, native_backends

KVCACHE_BACKEND = "lab_kvcache"
#: The models it serves (model_repository/<name>/, each with 1/kvlm.pt copied there by set-up).
KV_MODELS = ("generate_kv_paged", "generate_kv_contiguous", "generate_kv_recompute")


def kvcache_source() -> Path:
    return native_backends.FRAMEWORKS_DIR / KVCACHE_BACKEND / f"{KVCACHE_BACKEND}.cc"


def kvcache_inputs(runtime: native_backends.FrameworkRuntime) -> list[Path]:
    """What the library is made from: lab_libtorch's inputs, with this backend's folder for lab_libtorch's."""
    theirs = native_backends.libtorch_source().parent
    return [*kvcache_source().parent.iterdir(),
            *(p for p in native_backends.libtorch_inputs(runtime) if p.parent != theirs)]


def kvcache_is_stale(backend_dir: Path = BACKEND_DIR, runtime: native_backends.FrameworkRuntime | None = None) -> bool:
    """True when the library is missing or older than any of :func:`kvcache_inputs`."""
    target = cbackend.library_path(KVCACHE_BACKEND, Path(backend_dir))
    if not target.exists():  # before the runtime is looked up
        return True
    runtime = runtime or native_backends.libtorch_runtime()
    return cbackend.outdated(target, (p for p in kvcache_inputs(runtime) if p.is_file()))


def kvcache_command(runtime: native_backends.FrameworkRuntime, output: Path, abi: int,
                    compiler: str = "g++") -> list[str]:
    """native_backends' g++ line for libtorch, compiling this backend's source instead of lab_libtorch's."""
    theirs, ours = str(native_backends.libtorch_source()), str(kvcache_source())
    return [ours if arg == theirs else arg for arg in native_backends.libtorch_command(runtime, output, abi, compiler)]


def build_kvcache(backend_dir: str | Path = BACKEND_DIR, *, force: bool = False) -> Path:
    """Build ``lab_kvcache`` into ``<backend_dir>/lab_kvcache/libtriton_lab_kvcache.so`` when stale (or
    ``force``); its path. Raises :class:`BackendBuildError` quoting g++ on failure. Written to a temporary
    name and renamed (cbackend.built_in_place): a running server never maps half a file."""
    backend_dir = Path(backend_dir)
    runtime = native_backends.libtorch_runtime()
    target = cbackend.library_path(KVCACHE_BACKEND, backend_dir)
    if not force and not kvcache_is_stale(backend_dir, runtime):
        return target
    return native_backends.build_cxx(
        KVCACHE_BACKEND, kvcache_source(), target,
        lambda tmp, compiler: kvcache_command(runtime, tmp, native_backends.cxx11_abi(), compiler))


def build_all(force: bool = False) -> dict[str, Path]:
    """Set-up's step (lab_backends/setup_steps.py LIBRARIES)."""
    return {KVCACHE_BACKEND: build_kvcache(force=force)}
