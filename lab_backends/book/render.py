"""Render executed notebooks and the README into a small static site: ``build/book/``.

Why nbconvert and not Jupyter Book: the lessons are already executed (by nbval or ``make book``),
so rendering is a per-notebook HTML export plus a navigation bar, with no second execution and no
new tool chain. Plots are embedded in each page (data URIs), so the folder can be copied or opened
from disk as it is: ``build/book/index.html`` is the README, followed by the list of lessons.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import mistune
import nbformat
from nbconvert import HTMLExporter

from lab_backends.book import book_dir, executed_dir, lessons
from lab_backends.errors import LabBackendsError
from lab_backends.paths import PROJECT_ROOT

STYLE = """
<style>
.lab-book-nav { position: sticky; top: 0; z-index: 100; background: #1f2937; color: #e5e7eb;
  font: 14px/1.4 system-ui, sans-serif; padding: 8px 16px; display: flex; gap: 16px; align-items: center; }
.lab-book-nav a { color: #93c5fd; text-decoration: none; }
.lab-book-nav select { font: inherit; max-width: 40em; }
.lab-book-note { font: 13px system-ui, sans-serif; color: #374151; background: #fef3c7; padding: 6px 16px; }
.lab-book-index { max-width: 60em; margin: 0 auto; padding: 0 16px 48px; font: 15px/1.55 system-ui, sans-serif; }
.lab-book-index table { border-collapse: collapse; }
.lab-book-index td, .lab-book-index th { border: 1px solid #d1d5db; padding: 4px 8px; }
.lab-book-index pre { background: #f3f4f6; padding: 8px; overflow-x: auto; }
</style>
"""


class BookError(LabBackendsError):
    """The book cannot be rendered: an executed copy of a lesson is missing."""


def title_of(book: nbformat.NotebookNode, fallback: str) -> str:
    """The lesson's title: the first markdown heading, without the '#'."""
    for cell in book.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if match:
                return match.group(1).strip()
    return fallback


def _nav(pages: list[tuple[str, str]], current: int | None) -> str:
    options = "".join(
        f'<option value="{href}"{" selected" if i == current else ""}>{html.escape(title)}</option>'
        for i, (href, title) in enumerate(pages)
    )
    parts = ['<nav class="lab-book-nav"><a href="index.html">Triton Backends Workbench</a>']
    if current is not None and current > 0:
        parts.append(f'<a href="{pages[current - 1][0]}">&larr; previous</a>')
    if current is not None and current + 1 < len(pages):
        parts.append(f'<a href="{pages[current + 1][0]}">next &rarr;</a>')
    parts.append('<select onchange="location.href=this.value"><option value="index.html">lessons…</option>'
                 f"{options}</select></nav>")
    return "".join(parts)


def _note(book: nbformat.NotebookNode) -> str:
    meta = book.metadata.get("lab_book", {})
    if not meta:
        return ""
    size = "LAB_FAST=1 (shrunk loads)" if meta.get("lab_fast") else "full size"
    failed = meta.get("failed_cells") or []
    text = (f"Executed by {html.escape(str(meta.get('executed_by', '?')))}, {size}; "
            f"{meta.get('cells_run', '?')} of {meta.get('code_cells', '?')} code cells ran"
            + (f"; cells that FAILED: {failed}" if failed else "")
            + ". Numbers differ from run to run and machine to machine.")
    return f'<div class="lab-book-note">{text}</div>'


def _insert_after_body(page: str, extra: str) -> str:
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + extra, page, count=1)


def _readme_html() -> str:
    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    body = mistune.create_markdown(plugins=["table", "strikethrough", "url"])(text)
    # Relative links point into the repository: from build/book/ that is two folders up.
    return re.sub(r'href="(?!https?:|#|mailto:)([^"]+)"', r'href="../../\1"', body)


def render(source: Path | None = None, target: Path | None = None) -> list[Path]:
    """Render every lesson's executed copy from ``source`` into ``target``; the pages written.

    Every notebook in ``notebooks/`` must have an executed copy: a missing one is an error that
    says how to make it, rather than a book that silently lacks a lesson.
    """
    source, target = source or executed_dir(), target or book_dir()
    missing = [p.name for p in lessons() if not (source / p.name).exists()]
    if missing:
        raise BookError(
            f"no executed copy of {', '.join(missing)} in {source}: run `make book` (executes every notebook), "
            "or the nbval step of `make test`, which writes them there"
        )
    books = [nbformat.read(source / p.name, as_version=4) for p in lessons()]
    pages = [(f"{p.stem}.html", title_of(b, p.stem)) for p, b in zip(lessons(), books)]
    target.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab")
    written = []
    for i, (book, (href, title)) in enumerate(zip(books, pages)):
        body, _ = exporter.from_notebook_node(book, resources={"metadata": {"name": title}})
        page = _insert_after_body(body, STYLE + _nav(pages, i) + _note(book))
        (target / href).write_text(page, encoding="utf-8")
        written.append(target / href)
    listing = "".join(f'<li><a href="{href}">{html.escape(title)}</a></li>' for href, title in pages)
    index = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Triton Backends Workbench: the book</title>'
        f"{STYLE}</head><body>{_nav(pages, None)}<main class=\"lab-book-index\">"
        f"<h2>The lessons, executed</h2><ol>{listing}</ol><hr>{_readme_html()}</main></body></html>"
    )
    (target / "index.html").write_text(index, encoding="utf-8")
    return [target / "index.html", *written]
