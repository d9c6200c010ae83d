"""Every lesson ends with a Further reading cell: at least three upstream Triton links, as listed.

The links live in ``lab_backends.lessons.further_reading.LINKS``; the notebook's last cell must be
exactly what ``render`` makes of them, so a notebook rewritten elsewhere is caught and fixed with
``python -m lab_backends.lessons.further_reading``. No network: the links' form is checked, not
their liveness.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lab_backends.lessons import further_reading

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LINK = re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)")
FIX = "run `.venv/bin/python -m lab_backends.lessons.further_reading` to (re)write it"


def test_there_are_lessons() -> None:
    assert len(LESSONS) >= 10


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_each_lesson_ends_with_three_upstream_links(path: Path) -> None:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    last = cells[-1]
    source = "".join(last["source"])
    assert last["cell_type"] == "markdown" and source.startswith(further_reading.HEADING), \
        f"{path.name} must end with a '{further_reading.HEADING}' markdown cell: {FIX}"
    upstream = [url for _, url in LINK.findall(source) if url.startswith(further_reading.UPSTREAM_PREFIXES)]
    assert len(upstream) >= 3, f"{path.name}: only {len(upstream)} upstream Triton links in Further reading"
    assert source == further_reading.render(path), f"{path.name}'s Further reading differs from LINKS: {FIX}"


def test_every_link_list_is_upstream_and_long_enough() -> None:
    for number, links in further_reading.LINKS.items():
        assert len(links) >= 3, number
        for title, url, why in links:
            assert url.startswith(further_reading.UPSTREAM_PREFIXES), (number, url)
            assert title and why, (number, url)


def test_append_is_idempotent_and_adds_a_cell_to_a_notebook_without_one(tmp_path: Path) -> None:
    copy = tmp_path / "03_copy.ipynb"
    shutil.copy(LESSONS[3], copy)
    book = json.loads(copy.read_text(encoding="utf-8"))
    book["cells"] = book["cells"][:-1]  # a notebook someone rewrote, without the cell
    copy.write_text(json.dumps(book, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert further_reading.append(copy) is True
    assert further_reading.append(copy) is False, "a second run changes nothing"
    cells = json.loads(copy.read_text(encoding="utf-8"))["cells"]
    assert "".join(cells[-1]["source"]) == further_reading.render(copy)
    assert len(cells) == len(book["cells"]) + 1


def test_a_notebook_without_links_gets_a_message_that_says_what_to_add(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="add at least three upstream links under key '99'"):
        further_reading.render(tmp_path / "99_new.ipynb")
