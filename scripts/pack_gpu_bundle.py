#!/usr/bin/env python3
"""Pack the few files scripts/gpu_check.sh needs on a GPU machine that has no internet.

The lent GPU machine has Python 3.12, CUDA torch and numpy 2, and nothing else of ours; at most
64 MiB travel with the working tree. The nvidia-pytriton wheel is 55 MB packed and ~145 MB
installed, so we carry only what one server run needs:

* ``tritonserver``, the Python backend, the **3.12** stub and the local response cache;
* the bundled shared libraries those four actually link (their ``DT_NEEDED`` closure inside
  ``nvidia_pytriton.libs``, read with ``readelf``), not the libpython copies and friends;
* the C backends of ``c_backends/``, prebuilt here against the same server library, as a fallback
  for a machine without gcc (gpu_check.py rebuilds them there when it can);
* a numpy 1.26 wheel for cp312: numpy 2 corrupts inputs in this Triton, and the machine has numpy 2.

Everything binary goes into one ``triton-bundle.tar.xz`` (xz roughly thirds it), written to
``build/gpu_bundle/`` (git-ignored), which the device call names in ``carry``.

Usage: ``.venv/bin/python scripts/pack_gpu_bundle.py [--out build/gpu_bundle]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The stub must match the GPU machine's Python (3.12.3 as last seen there).
TARGET_PYTHON = (3, 12)
NUMPY_PIN = "numpy==1.26.4"
#: What may travel in all (device README); the working tree itself takes a few MiB of it.
CARRY_LIMIT_MIB = 64
BUNDLE_BUDGET_MIB = 56


def needed(path: Path) -> list[str]:
    """The ``DT_NEEDED`` sonames of an ELF file (``readelf`` from binutils, which gcc brings)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise SystemExit("readelf not found: install binutils (`apt-get install binutils`)")
    out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def library_closure(roots: list[Path], lib_dir: Path) -> list[Path]:
    """Every library of ``lib_dir`` reachable from ``roots`` through ``DT_NEEDED`` (system ones stay)."""
    todo, seen = list(roots), set()
    found: list[Path] = []
    while todo:
        for soname in needed(todo.pop()):
            candidate = lib_dir / soname
            if soname in seen or not candidate.is_file():
                continue  # libc, libstdc++, libz, libpython...: the machine's own
            seen.add(soname)
            found.append(candidate)
            todo.append(candidate)
    return sorted(found)


def prebuild_c_backends(out_dir: Path) -> dict[str, str]:
    """Build every ``c_backends/<name>`` here (x86-64, same server library); name -> error if not."""
    results: dict[str, str] = {}
    try:
        from lab_backends.server import cbackend
    except Exception as exc:  # noqa: BLE001 - the C backend module may not exist yet
        return {"*": f"lab_backends.server.cbackend unavailable: {exc}"}
    for name, source in cbackend.sources().items():
        try:
            cbackend.build(source, name, out_dir)
            results[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - report, keep packing the rest
            results[name] = f"build failed: {exc}"
    return results


def download_numpy(dest: Path) -> Path:
    """The numpy 1.26 wheel for CPython 3.12 on manylinux x86-64 (from PyPI, via pip)."""
    dest.mkdir(parents=True, exist_ok=True)
    have = sorted(dest.glob("numpy-1.26.4-cp312-*.whl"))
    if have:
        return have[0]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
         "-d", str(dest), NUMPY_PIN],
        check=True,
    )
    return sorted(dest.glob("numpy-1.26.4-cp312-*.whl"))[0]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "gpu_bundle")
    parser.add_argument("--preset", type=int, default=9, help="xz preset (0-9); -1 writes a plain .tar (tests)")
    parser.add_argument("--stub-python", default="%d.%d" % TARGET_PYTHON,
                        help="stub to pack (the GPU machine's Python; tests pack this machine's)")
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy wheel (CPU smoke tests)")
    args = parser.parse_args(argv)

    from lab_backends.server.bundle import find_bundle

    bundle = find_bundle()
    stub_version = tuple(int(x) for x in args.stub_python.split("."))
    stub = bundle.stub(stub_version)
    if not stub.is_file():
        raise SystemExit(f"no Python {args.stub_python} stub at {stub}: the pytriton wheel changed")
    members: dict[str, Path] = {
        "bin/tritonserver": bundle.binary,
        "backends/python/libtriton_python.so": bundle.python_backend / "libtriton_python.so",
        "backends/python/triton_python_backend_utils.py": bundle.python_backend / "triton_python_backend_utils.py",
        "backends/python/triton_python_backend_stub": stub,
        "caches/local/libtritoncache_local.so": bundle.caches / "local" / "libtritoncache_local.so",
    }
    elf_roots = [p for name, p in members.items() if not name.endswith(".py")]
    for lib in library_closure(elf_roots, bundle.libs):
        members[f"lib/{lib.name}"] = lib

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        c_results = prebuild_c_backends(Path(tmp) / "backends")
        for lib in sorted((Path(tmp) / "backends").glob("*/libtriton_*.so")):
            members[f"prebuilt_backends/{lib.parent.name}/{lib.name}"] = lib
        for old in args.out.glob("triton-bundle.tar*"):
            old.unlink()
        tar_path = args.out / ("triton-bundle.tar" if args.preset < 0 else "triton-bundle.tar.xz")
        raw = sum(p.stat().st_size for p in members.values())
        print(f"packing {len(members)} files ({raw / 2**20:.1f} MiB) into {tar_path} ...", flush=True)
        with (open(tar_path, "wb") if args.preset < 0 else lzma.open(tar_path, "wb", preset=args.preset)) as fh, \
                tarfile.open(fileobj=fh, mode="w") as tar:
            for arcname, path in sorted(members.items()):
                tar.add(path, arcname=f"triton/{arcname}", recursive=False)

    wheel = None if args.no_numpy else download_numpy(args.out / "wheels")
    files = [tar_path] + ([wheel] if wheel else [])
    total = sum(p.stat().st_size for p in files)
    manifest = {
        "triton_bundle": {name: str(path) for name, path in sorted(members.items())},
        "c_backends_prebuilt": c_results,
        "files": {str(p.relative_to(args.out)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files},
        "stub_python": args.stub_python,
        "total_mib": round(total / 2**20, 2),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"bundle: {total / 2**20:.1f} MiB in {args.out} (tar {tar_path.stat().st_size / 2**20:.1f} MiB, "
          f"{wheel.name if wheel else 'no numpy wheel'}); C backends: {c_results}")
    if total > BUNDLE_BUDGET_MIB * 2**20 and args.preset >= 0:  # a plain .tar is for local tests only
        print(f"WARNING: over the {BUNDLE_BUDGET_MIB} MiB budget (the carry limit is {CARRY_LIMIT_MIB} MiB "
              "with the working tree)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
