"""A broken model in the repository must not take the server down, and must say why it is broken.

The broken models are made in a temporary repository from a copy of ``rel_double``: a config
with a syntax error (the text below is deliberately *not* valid, so it cannot come from the
protobuf writer) and a model folder whose ``model.py`` is missing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from lab_backends.errors import ModelLoadError
from lab_backends.server.processes import SHM_DIR, SHM_PREFIX, remove_shm
from lab_backends.server.repository import config_text, preflight, read_config
from lab_backends.server.triton_server import TritonServer

from .conftest import known_good

pytestmark = pytest.mark.server

BROKEN_LINE = 'max_batch_size: "eight"'  # a string where an integer belongs


def _copy_as(repo: Path, name: str) -> Path:
    target = repo / name
    shutil.copytree(repo / "rel_double", target)
    config = read_config(target)
    config.name = name
    (target / "config.pbtxt").write_text(config_text(config))
    return target


def _broken_config(repo: Path) -> str:
    target = _copy_as(repo, "rel_broken_config")
    text = (target / "config.pbtxt").read_text().replace("max_batch_size: 8", BROKEN_LINE)
    assert BROKEN_LINE in text
    (target / "config.pbtxt").write_text(text)
    return target.name


def _missing_file(repo: Path) -> str:
    target = _copy_as(repo, "rel_missing_file")
    (target / "1" / "model.py").unlink()
    return target.name


def test_broken_config_is_reported_with_its_reason_and_the_server_serves(scratch_repo):
    broken = _broken_config(scratch_repo)
    with TritonServer(scratch_repo, allow_broken_models=True) as server:
        assert server.is_ready()
        assert set(server.broken_models) == {broken}
        reason = server.broken_models[broken]
        assert "max_batch_size" in reason and '"eight"' in reason, reason  # the field and the value
        assert "line 2" in reason.lower() or "2:17" in reason, reason  # ...and where it is
        known_good(server, "grpc")
        known_good(server, "http")


def test_without_allow_broken_models_the_error_names_model_reason_and_fix(scratch_repo):
    broken = _broken_config(scratch_repo)
    server = TritonServer(scratch_repo, models=["rel_double", broken])
    with pytest.raises(ModelLoadError) as caught:
        server.start()
    assert not server.is_running()  # stopped, not leaked
    assert caught.value.model == broken
    assert "max_batch_size" in caught.value.reason
    assert "allow_broken_models=True" in str(caught.value)


def test_preflight_names_a_missing_model_file(scratch_repo):
    missing = _missing_file(scratch_repo)
    problems = preflight([scratch_repo])
    assert set(problems) == {missing}
    assert str(scratch_repo / missing / "1" / "model.py") in problems[missing]
    assert preflight([scratch_repo], models=["rel_double"]) == {}


def test_missing_model_file_model_is_left_out_and_the_rest_serves(scratch_repo):
    """What a learner gets today: preflight the repository, load the sound models only."""
    missing = _missing_file(scratch_repo)
    problems = preflight([scratch_repo])
    sound = sorted(p.name for p in scratch_repo.iterdir() if p.name not in problems)
    with TritonServer(scratch_repo, models=sound) as server:
        index = {e["name"]: e.get("state") for e in server.repository_index()}
        assert index["rel_double"] == "READY"
        assert index.get(missing) != "READY"
        known_good(server, "grpc")


def test_missing_model_file_is_reported_as_broken_without_hanging(scratch_repo):
    missing = _missing_file(scratch_repo)
    before = _regions()
    try:
        with TritonServer(scratch_repo, allow_broken_models=True, startup_timeout_s=4) as server:
            assert missing in server.broken_models
            assert "model.py" in server.broken_models[missing]
            known_good(server, "grpc")
    finally:
        # The hung model's stub died before stop() could read its region name, so the 1 MiB
        # region would outlive the server (see docs/reliability.md): remove what this test left.
        remove_shm(_regions() - before - _mapped_by_anyone())


def _regions() -> set[str]:
    return {p.name for p in SHM_DIR.glob(SHM_PREFIX + "*")}


def _mapped_by_anyone() -> set[str]:
    """Regions some live process still maps (another server's, or one just being created)."""
    pattern = re.compile(re.escape(SHM_PREFIX) + r"[\w-]+")
    mapped: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                mapped |= set(pattern.findall(Path(f"/proc/{entry}/maps").read_text()))
            except OSError:
                pass
    return mapped


def test_committed_test_models_have_valid_configs():
    """The suite's own models parse with Triton's schema and are named after their folders."""
    from .conftest import TEST_MODELS

    folders = sorted(p for p in TEST_MODELS.iterdir() if (p / "config.pbtxt").exists())
    assert [p.name for p in folders] == [
        "rel_crash", "rel_double", "rel_raise", "rel_respond_then_hold", "rel_wrong_count"]
    for folder in folders:
        config = read_config(folder)
        assert config.name == folder.name and config.backend == "python"
        assert (folder / "1" / "model.py").is_file()
    assert preflight([TEST_MODELS]) == {}
