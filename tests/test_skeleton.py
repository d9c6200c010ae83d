"""The project's promises about itself: two commands, one dependency list, CI = make test."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _normalize(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


def test_environment_yml_pip_list_equals_project_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(map(_normalize, pip)) == sorted(map(_normalize, project))


def test_numpy_and_torch_pins():
    deps = [_normalize(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert "numpy<2" in deps, "numpy 2 corrupts inputs in this Triton"
    assert "torch==2.13.0" in deps, "a bare torch pulls a multi-GB CUDA build"
    assert "onnxscript" in deps


def test_ci_runs_make_test():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in lines


def test_readme_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_ensemble_version_folders_are_tracked():
    """git drops empty folders; an ensemble whose '1/' is missing in a clone fails to load."""
    import subprocess

    from lab_backends.server.repository import model_dirs, read_config

    for repo in ("model_repository", "model_repository_gpu"):
        for name, folder in model_dirs([ROOT / repo]).items():
            if read_config(folder).platform == "ensemble":
                tracked = subprocess.run(
                    ["git", "ls-files", str(folder.relative_to(ROOT) / "1")],
                    cwd=ROOT, capture_output=True, text=True, check=True,
                ).stdout
                assert tracked.strip(), f"{folder}/1 is not tracked: add a .gitkeep"
