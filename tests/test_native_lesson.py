"""Notebook 09c's toolkit without a server: which pairs it compares, and its C++ reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_backends.errors import LabBackendsError
from lab_backends.lessons import native_lesson
from lab_backends.server import native_backends

LIBTORCH_SOURCE = native_backends.FRAMEWORKS_DIR / "lab_libtorch" / "lab_libtorch.cc"


def test_both_frameworks_are_compared_once_built(tmp_path: Path) -> None:
    assert [p.framework for p in native_lesson.pairs()] == ["tensorflow", "pytorch"]  # set-up built both
    with pytest.raises(LabBackendsError, match=r"digits_tf_native: its backend 'lab_tensorflow' is not built .*"
                                               r"run `make setup`"):
        native_lesson.pairs(backend_dir=tmp_path)


def test_show_cpp_prints_a_definition_not_a_declaration_or_a_call(capsys) -> None:
    text = native_lesson.show_cpp(LIBTORCH_SOURCE, "gather")
    assert "s.offset" in text and text.count("{") == text.count("}")
    assert capsys.readouterr().out.startswith("lab_libtorch.cc:")
    with pytest.raises(LabBackendsError, match="defines no function 'no_such_step'"):
        native_lesson.show_cpp(LIBTORCH_SOURCE, "no_such_step")
