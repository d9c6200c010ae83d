"""Notebook 09c's toolkit without a server: which pairs it compares, and its C++ reader."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
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


def test_batching_lines_say_which_way_the_lead_went() -> None:
    """The sentence 09c prints after section 3 follows the numbers (a lead within 10% reads as the same)."""
    pair = native_lesson.Pair("tensorflow", "w", "n")

    def summary(rps_native: float) -> pd.DataFrame:
        return pd.DataFrame({"p50_ms_c1": [5.0, 4.0], "rps_c16": [1000.0, rps_native],
                             "avg_batch_c16": [15.0, 15.0]}, index=["w", "n"])

    # Alone native is 1.25x as fast; at c=16 it serves 1.5x, 1.0x, 1.3x the wrapped throughput.
    for rps, went in ((1500.0, "grew"), (1000.0, "shrank"), (1300.0, "stayed about the same")):
        (line,) = native_lesson.batching_lines(summary(rps), [pair])
        assert line.startswith("tensorflow: native is 1.25x as fast alone") and line.endswith(f"its lead {went}"), line


def test_thread_names_count_this_process_threads() -> None:
    names = native_lesson.thread_names(os.getpid())
    assert sum(names.values()) >= 1 and all(isinstance(n, str) and n for n in names)
    assert sum(native_lesson.PYTHON_INSTANCE_THREADS.values()) == 34  # 32 pool + 2 monitors (python_be.cc)
