"""The rendered book (``build/book/``): every lesson has a page, with its plots and its outputs.

Not collected by ``pytest tests`` (the name does not start with ``test_``): ``make test`` runs it
explicitly, right after rendering the book from what nbval executed. Run it by hand with
``.venv/bin/python -m pytest tests/check_book.py`` after ``make book``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from lab_backends.book import book_dir, executed_dir, lessons

LESSONS = lessons()
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
PLOTS = re.compile(r"plt\.|plots\.|waterfall\(|_figure\(|\.plot\(")


def _images(book: nbformat.NotebookNode, types: tuple[str, ...] = IMAGE_TYPES) -> int:
    return sum(1 for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if any(t in o.get("data", {}) for t in types))


def test_the_front_page_is_the_readme_and_lists_every_lesson() -> None:
    index = book_dir() / "index.html"
    assert index.exists(), f"no {index}: render the book with `.venv/bin/python -m lab_backends.book render`"
    page = index.read_text(encoding="utf-8")
    readme_title = (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines()[0].lstrip("# ")
    assert readme_title in page
    for path in LESSONS:
        assert f'href="{path.stem}.html"' in page, f"the front page does not link {path.stem}.html"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_each_lesson_page_carries_its_outputs_and_plots(path: Path) -> None:
    page_path = book_dir() / f"{path.stem}.html"
    assert page_path.exists(), f"no page for {path.name} in {book_dir()}"
    page = page_path.read_text(encoding="utf-8")
    executed = nbformat.read(executed_dir() / path.name, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name}: some code cells never ran"
    errors = [i for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: cells {errors} ended in an error; the page would show a traceback"
    images = _images(executed)
    plots_in_source = any(PLOTS.search(c.source) for c in code)
    assert not plots_in_source or images >= 1, f"{path.name} draws plots but its executed copy holds no image"
    raster = _images(executed, ("image/png", "image/jpeg"))
    embedded = len(re.findall(r'<img[^>]+src="data:image/(?:png|jpeg)', page))
    assert embedded >= raster, f"{path.name}: {raster} plots were produced, the page embeds {embedded}"
    assert "✓" in page, f"{path.name}: no check mark in the page: the checks' output is missing"
