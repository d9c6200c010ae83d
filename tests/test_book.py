"""The book's two halves without a Triton server: nbval's outputs captured, executed copies rendered.

The capture test runs real nbval on a two-cell notebook (a real kernel, a real matplotlib plot),
so that an nbval upgrade that stops keeping ``test_outputs`` on its items fails here, not in a
book that silently has no plots.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lab_backends.book import capture
from lab_backends.book import render as render_mod

ROOT = Path(__file__).resolve().parent.parent


def _tiny_notebook(path: Path) -> Path:
    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_markdown_cell("# 98 · A tiny lesson\n**What you will learn**: nothing"),
        nbformat.v4.new_code_cell("print('✓ it ran')"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                                  "plt.plot([1, 2, 3])\nplt.show()"),
    ]
    nbformat.write(book, path)
    return path


def test_nbval_outputs_are_captured_into_an_executed_copy(tmp_path: Path) -> None:
    notebook = _tiny_notebook(tmp_path / "98_tiny.ipynb")
    out = tmp_path / "executed"
    env = {**os.environ, "LAB_BOOK_EXECUTED": str(out), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "lab_backends.book.capture",
         "--nbval-lax", "--rootdir", str(tmp_path), str(notebook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    executed = nbformat.read(out / notebook.name, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2]
    assert "✓ it ran" in code[0].outputs[0]["text"]
    assert any("image/png" in o.get("data", {}) for o in code[1].outputs), "the plot was not kept"
    assert executed.metadata["lab_book"]["failed_cells"] == []
    assert not nbformat.read(notebook, as_version=4).cells[1].get("outputs"), "the source notebook stays clean"


def test_render_writes_a_page_per_lesson_and_the_readme_as_front_page(tmp_path: Path, monkeypatch) -> None:
    lesson = _tiny_notebook(tmp_path / "98_tiny.ipynb")
    outputs = {0: [nbformat.v4.new_output("stream", name="stdout", text="✓ it ran\n")]}
    capture.write_executed(lesson, outputs, [], tmp_path / "executed")
    monkeypatch.setattr(render_mod, "lessons", lambda: [lesson])
    pages = render_mod.render(tmp_path / "executed", tmp_path / "book")
    assert [p.name for p in pages] == ["index.html", "98_tiny.html"]
    index = (tmp_path / "book" / "index.html").read_text(encoding="utf-8")
    assert "Triton Backends Workbench" in index and 'href="98_tiny.html"' in index
    page = (tmp_path / "book" / "98_tiny.html").read_text(encoding="utf-8")
    assert "lab-book-nav" in page and "✓ it ran" in page and "1 of 2 code cells ran" in page


def test_render_names_the_lessons_that_were_never_executed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(render_mod, "lessons", lambda: [_tiny_notebook(tmp_path / "98_tiny.ipynb")])
    with pytest.raises(render_mod.BookError, match="98_tiny.ipynb.*make book"):
        render_mod.render(tmp_path / "nothing_here", tmp_path / "book")
