"""The real Triton that ships inside the ``nvidia-pytriton`` wheel, and how to run it here.

The wheel holds ``tritonserver`` 2.51, its shared libraries (renamed, in ``nvidia_pytriton.libs``),
the Python backend and one backend stub per Python version. Two traps shape this module:

* The stub must be copied next to ``libtriton_python.so`` in *our* backend directory; once copied,
  its relative RPATH no longer finds ``libcudart`` and a model load hangs for minutes with no error.
  So the library folder always goes on ``LD_LIBRARY_PATH``.
* The stub embeds ``libpython`` and ignores ``PYTHONPATH``. It finds site-packages by looking up
  ``python3`` on ``PATH``, so the server is started with this environment's ``bin`` first on
  ``PATH`` ("the venv is active"), and the interpreter's own ``libpython`` is preferred.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import EnvironmentMismatchError, ServerBinaryNotFoundError
from lab_backends.paths import BACKEND_DIR

PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Bundle:
    """Paths inside the installed ``nvidia-pytriton`` wheel."""

    root: Path  # .../site-packages/pytriton/tritonserver

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def libs(self) -> Path:
        return self.root.parent.parent / "nvidia_pytriton.libs"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def stub(self, version: tuple[int, int] | None = None) -> Path:
        major, minor = version or sys.version_info[:2]
        return self.root / "python_backend_stubs" / f"{major}.{minor}" / STUB_NAME

    def server_library(self) -> Path:
        """The bundled ``libtritonserver-<hash>.so`` that C backends link against."""
        found = sorted(self.libs.glob("libtritonserver*.so*"))
        if not found:
            raise ServerBinaryNotFoundError(
                f"no libtritonserver*.so in {self.libs}; reinstall with "
                f"`pip install --force-reinstall {PYTRITON_REQUIREMENT}`"
            )
        return found[0]


def find_bundle() -> Bundle:
    """Locate the embedded Triton or say exactly what to install."""
    # Located, not imported: importing pytriton costs ~0.4 s (its own client stack) and only its files are used.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.origin:
        raise ServerBinaryNotFoundError(
            "the embedded Triton comes from the nvidia-pytriton wheel, which is not installed in "
            f"{sys.prefix}; run `make lab` (or `pip install {PYTRITON_REQUIREMENT}`)"
        )
    bundle = Bundle(Path(spec.origin).resolve().parent / "tritonserver")
    if not bundle.binary.is_file():
        raise ServerBinaryNotFoundError(
            f"tritonserver binary missing at {bundle.binary}; reinstall with "
            f"`pip install --force-reinstall {PYTRITON_REQUIREMENT}`"
        )
    stub = bundle.stub()
    if not stub.is_file():
        have = sorted(p.name for p in (bundle.root / "python_backend_stubs").glob("*"))
        raise ServerBinaryNotFoundError(
            f"no Python backend stub for Python {sys.version_info[0]}.{sys.version_info[1]} at "
            f"{stub}; the wheel ships stubs for {', '.join(have) or 'none'}: create the "
            "environment with one of those Python versions"
        )
    return bundle


def check_model_environment() -> None:
    """Refuse numpy 2: in this Triton it silently corrupts input tensors ([1,2,3,4] -> [1,1,1,1])."""
    try:
        version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError as exc:
        raise EnvironmentMismatchError(
            f"numpy is not installed in {sys.prefix}, and model code needs it: "
            "`pip install 'numpy<2'`"
        ) from exc
    if int(version.split(".")[0]) >= 2:
        raise EnvironmentMismatchError(
            f"numpy {version} is installed in {sys.prefix}; Triton 2.51's Python backend reads "
            "inputs wrongly with numpy 2 (measured: [1,2,3,4] arrives as [1,1,1,1]). "
            "Fix: `pip install 'numpy<2'` in this environment"
        )


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.stat().st_mtime >= src.stat().st_mtime:
        return
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)  # atomic: two servers starting side by side never see half a file


def prepare_backend_dir(bundle: Bundle, backend_dir: Path = BACKEND_DIR) -> Path:
    """Lay out ``backend_dir/python`` with the Python backend and the stub for this Python.

    C backends built by :mod:`lab_backends.server.cbackend` live beside it in ``backend_dir/<name>/``.
    """
    target = backend_dir / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name in PYTHON_BACKEND_FILES:
        _copy_if_changed(bundle.python_backend / name, target / name)
    _copy_if_changed(bundle.stub(), target / STUB_NAME)
    return backend_dir


def server_environment(bundle: Bundle, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ``tritonserver`` so that its stubs run model code in *this* environment."""
    env = dict(os.environ if base is None else base)
    lib_dirs = [str(bundle.libs)]
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and ldlib and (Path(libdir) / ldlib).exists():
        lib_dirs.append(libdir)  # the stub then embeds the same libpython as this interpreter
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "/usr/bin:/bin")])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env.pop("PYTHONHOME", None)
    # Model code pins its own framework threads; keep BLAS from oversubscribing 2 cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    # TensorFlow inside the server process (the C backend lab_tensorflow) reads these when its library
    # is loaded, before any backend code runs (measured: the oneDNN notice came before Initialize):
    # the quiet log and plain kernels that digits_tf's stub sets (lab_backends/digits/export_tf.py QUIET_ENV).
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    return env
