"""``python -m lab_backends.book execute|render|all``: the book of executed lessons.

``render`` builds ``build/book/`` from ``build/executed/`` (written by nbval in ``make test`` or
by ``execute``); ``all`` is what ``make book`` runs: execute at full size, then render.
"""

from __future__ import annotations

import sys

from lab_backends.book import book_dir
from lab_backends.book.execute import execute_all
from lab_backends.book.render import render


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "all"
    if command not in ("execute", "render", "all"):
        print(f"unknown command {command!r}: use execute, render or all", file=sys.stderr)
        return 2
    failed = {}
    if command in ("execute", "all"):
        failed = {name: cells for name, cells in execute_all().items() if cells}
    if command in ("render", "all"):
        pages = render()
        print(f"{len(pages) - 1} lessons rendered: open {book_dir() / 'index.html'}")
    if failed:
        print(f"cells failed (their errors are in the pages): {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
