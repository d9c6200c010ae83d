"""Every lesson's re-measure fallback ran in ``make test``'s notebook run, and its claims held there.

Not collected by ``pytest tests`` (the name does not start with ``test_``): ``make test`` runs the
notebooks under nbval with ``LAB_FORCE_REMEASURE=1`` (every timing claim re-measures as if its first
try had missed: :func:`lab_backends.notebook.check_claims`), then this file reads what nbval executed
(``build/executed/``, the book's source) and asserts that each cell handing a claim a ``remeasure``
printed a re-measurement followed by ``✓``. A fallback runs in a learner's kernel only on a busy day;
here it runs every time, so a fault in it (notebook 10's once named a module never imported) fails CI.
"""

from __future__ import annotations

import nbformat
import pytest

from lab_backends.book import executed_dir, lessons

RE_MEASURED = "re-measuring once"
LESSONS = [book for book in lessons() if any("remeasure=" in c.source for c in nbformat.read(book, as_version=4).cells
                                             if c.cell_type == "code")]


def test_the_lessons_with_fallbacks_are_found() -> None:
    assert len(LESSONS) >= 5, [b.name for b in LESSONS]


@pytest.mark.parametrize("book", LESSONS, ids=[b.stem for b in LESSONS])
def test_every_fallback_ran_and_its_claims_held(book) -> None:
    executed = executed_dir() / book.name
    assert executed.exists(), f"no {executed}: run the notebooks under nbval first (make test does)"
    code = [c for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"]
    cells = [i for i, c in enumerate(code) if "remeasure=" in c.source]
    assert cells, f"{book.name}: no cell hands a claim a fallback"
    for index in cells:
        text = "".join(o.get("text", "") for o in code[index].get("outputs", []) if o.get("output_type") == "stream")
        assert RE_MEASURED in text, (f"{book.name} code cell {index}: its fallback never ran (was the notebook run "
                                     f"with LAB_FORCE_REMEASURE=1?):\n{text[-1500:]}")
        after = text.split(RE_MEASURED, 1)[1]
        assert "✓" in after and "expected, but not observed" not in after, (
            f"{book.name} code cell {index}: the claims did not hold on the re-measurement:\n{text[-1500:]}")
