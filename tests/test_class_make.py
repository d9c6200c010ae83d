"""``make class``'s first step, lab_backends/classroom/precompile.py, on every Python 3.11-3.13 found here, and
which installation ``make setup`` / ``make class`` keep. No server, no root: about 3 s (one Python: 1 s).

tests/class run the README's ``sudo make class`` for real (conftest.py); these are the cases a class cannot show:
a third-party file that this Python cannot compile is skipped and counted, one of ours fails the step, naming
its file and line, and a second run writes nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab_backends.classroom.precompile import PrecompileError, precompile

ROOT = Path(__file__).resolve().parent.parent

#: PEP 695 (Python 3.12), as torch's testing/_internal/py312_intrinsics.py: Python 3.11 cannot compile it.
PEP_695 = "def first[T](items: list[T]) -> T:\n    return items[0]\n"
BROKEN = "def broken(:\n    pass\n"

#: precompile() under another Python, without lab_backends/__init__ (it imports the server stack, which a bare
#: interpreter lacks): the real precompile.py, errors.py and paths.py, which need the standard library only.
UNDER = """
import sys, types
from pathlib import Path
root, theirs, ours = map(Path, sys.argv[1:4])
package = types.ModuleType("lab_backends")
package.__path__ = [str(root / "lab_backends")]
sys.modules["lab_backends"] = package
from lab_backends.classroom.precompile import PrecompileError, precompile
try:
    done = precompile([theirs], ours=ours, workers=2)
except PrecompileError as exc:
    print("error", exc)
else:
    print("ok", done.files, *sorted(p.name for p in done.skipped))
"""


def _pythons() -> dict[str, str]:
    """Python 3.11, 3.12 and 3.13, those found on PATH or in pyenv; this one always."""
    found = {f"{sys.version_info.major}.{sys.version_info.minor}": sys.executable}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in ("3.11", "3.12", "3.13"):
        candidates = [shutil.which(f"python{minor}"), *sorted(pyenv.glob(f"{minor}.*/bin/python{minor}"))]
        for candidate in candidates:
            if minor not in found and candidate and subprocess.run(
                    [str(candidate), "-c", "pass"], capture_output=True, timeout=30).returncode == 0:
                found[minor] = str(candidate)
    return found


def _tree(tmp: Path, broken_ours: bool) -> tuple[Path, Path]:
    """A site-packages (64 good modules: enough for the process pool; one PEP 695, one broken) and our package."""
    theirs, ours = tmp / "site-packages", tmp / "lab_backends"
    (theirs / "wheel" / "testing").mkdir(parents=True)
    ours.mkdir()
    for i in range(64):
        (theirs / "wheel" / f"m{i}.py").write_text(f"X = {i}\n")
    (theirs / "wheel" / "testing" / "py312_intrinsics.py").write_text(PEP_695)
    (theirs / "wheel" / "testing" / "broken.py").write_text(BROKEN)
    (ours / "fine.py").write_text("Y = 1\n")
    if broken_ours:
        (ours / "oops.py").write_text("x = 1\n" + BROKEN)
    return theirs, ours


@pytest.mark.parametrize("minor", ["3.11", "3.12", "3.13"])
def test_third_party_files_a_python_cannot_compile_are_skipped_and_ours_fail(minor: str, tmp_path: Path) -> None:
    python = _pythons().get(minor)
    if python is None:
        pytest.skip(f"no Python {minor} on this machine")
    theirs, ours = _tree(tmp_path / "good", broken_ours=False)
    done = subprocess.run([python, "-c", UNDER, str(ROOT), str(theirs), str(ours)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    skipped = ["broken.py"] if minor != "3.11" else ["broken.py", "py312_intrinsics.py"]
    assert done.stdout.split() == ["ok", str(64 + 1 + (minor != "3.11")), *skipped], done.stdout
    assert list((theirs / "wheel" / "__pycache__").glob("m0.*.pyc")), "nothing was compiled"

    theirs, ours = _tree(tmp_path / "bad", broken_ours=True)
    done = subprocess.run([python, "-c", UNDER, str(ROOT), str(theirs), str(ours)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("error ") and f"{ours / 'oops.py'}:2: SyntaxError" in done.stdout, done.stdout


def test_a_second_run_writes_nothing_and_the_command_says_what_it_skipped(tmp_path: Path) -> None:
    theirs, ours = _tree(tmp_path, broken_ours=False)
    first = precompile([theirs], ours=ours, workers=2)
    cached = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.pyc")}
    assert len(cached) == first.files, (len(cached), first.files)
    again = precompile([theirs], ours=ours, workers=2)
    assert (again.files, again.skipped) == (first.files, first.skipped)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.pyc")} == cached, "the second run compiled again"
    assert f"skipped {len(first.skipped)} third-party file(s)" in first.summary() and "broken.py" in first.summary()
    (ours / "oops.py").write_text(BROKEN)
    with pytest.raises(PrecompileError, match="oops.py:1: SyntaxError"):
        precompile([theirs], ours=ours, workers=1)


def _dry_run(venv: Path, *goals: str) -> str:
    out = subprocess.run(["make", "-n", *goals, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_setup_and_class_keep_the_venv_make_test_set_up(tmp_path: Path) -> None:
    """tests/class run ``sudo make setup`` and ``sudo make class`` beside other tests: they must not reinstall
    (pip would take lab_backends away from the processes importing it). A fresh venv gets the class extra."""
    fresh = tmp_path / "fresh"
    assert "-e '.[class]'" in _dry_run(fresh, "class")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / ".installed-test,class-stamp").touch()  # newer than pyproject.toml: make test's set-up
    for goal in ("setup", "class"):
        assert "pip install" not in _dry_run(kept, goal), goal
    assert "-m lab_backends.classroom.precompile" in _dry_run(kept, "class")
    assert "-e '.'" in _dry_run(kept, "lab"), "make lab keeps its own, smaller installation"
