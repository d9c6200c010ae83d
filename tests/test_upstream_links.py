"""Every upstream Triton link resolves at the ref it names (r24.10, Triton 2.51), offline.

The links (``github.com/triton-inference-server/<repo>/blob|tree/<ref>/<path>[#anchor]``) are
collected from the notebooks' cells, docs, README and code by ``scripts/upstream_index.py``, which
also made the committed index under ``tests/data/upstream_index/`` from mirrors of the upstream
repositories. Here only that index is read: no network, no mirror. A link must name an indexed
tree, a path that exists there (a folder for ``tree/``), lines within the file (``#L10-L20``) or a
heading GitHub makes for it (``#ensemble-models``), and no moving branch (``main``/``master``).
After adding or changing a link: ``.venv/bin/python scripts/upstream_index.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("upstream_index", ROOT / "scripts" / "upstream_index.py")
upstream_index = importlib.util.module_from_spec(_SPEC)
sys.modules["upstream_index"] = upstream_index  # dataclasses look their module up while it loads
_SPEC.loader.exec_module(upstream_index)

REGENERATE = "run `.venv/bin/python scripts/upstream_index.py`"
ORG = upstream_index.ORG_URL  # so that this file's fabricated links are not found by the scan


@pytest.fixture(scope="module")
def links() -> list:
    return upstream_index.find_links(exclude=(Path(__file__),))


@pytest.fixture(scope="module")
def index() -> dict:
    return upstream_index.load_index()


def _report(problems: list[str]) -> str:
    return f"{len(problems)} upstream link problem(s):\n" + "\n".join(problems)


def test_links_are_found_everywhere_they_live(links: list) -> None:
    assert len(links) >= 100, f"only {len(links)} upstream links found: is scripts/upstream_index.py's scan broken?"
    sources = {link.where.split(" ", 1)[0].split("/", 1)[0] for link in links}
    assert {"notebooks", "docs", "lab_backends"} <= sources, sources


def test_every_linked_tree_is_indexed(links: list, index: dict) -> None:
    missing = sorted({(link.repo, link.index_ref) for link in links} - set(index))
    assert not missing, f"not in tests/data/upstream_index/: {missing}; {REGENERATE}"


def test_no_unlinked_tree_in_the_index(links: list, index: dict) -> None:
    stale = sorted(set(index) - {(link.repo, link.index_ref) for link in links})
    assert not stale, f"indexed but no longer linked: {stale}; {REGENERATE} (it removes them)"


def test_index_records_what_it_was_made_from(index: dict) -> None:
    for (repo, ref), tree in index.items():
        assert len(tree["commit"]) == 40 and tree["files"], f"{repo}@{ref}: no commit or no files; {REGENERATE}"


def test_every_link_resolves(links: list, index: dict) -> None:
    problems = [f"{link.where}: {link.url}\n    {problem}"
                for link in links for problem in upstream_index.check_link(link, index)]
    assert not problems, _report(problems)


def test_no_link_follows_a_moving_branch(links: list) -> None:
    problems = [f"{link.where}: {link.url}\n    {problem}"
                for link in links for problem in upstream_index.check_ref(link)]
    assert not problems, _report(problems)


# --- the check itself catches what it should ----------------------------------------------------

FAKE_INDEX = {
    ("core", "r24.10"): {
        "repo": "core", "ref": "r24.10", "commit": "0" * 40, "unlisted": ["qa"],
        "files": ["README.md", "src/model.cc", "include/triton/core/tritonserver.h"],
        "lines": {"src/model.cc": 120, "README.md": 40},
        "headings": {"README.md": ["triton-core", "building", "building-1"]},
    },
}


@pytest.mark.parametrize(("url", "expected"), [
    (f"{ORG}/core/blob/r24.10/src/model.cc", None),
    (f"{ORG}/core/blob/r24.10/src/model.cc#L100-L120", None),
    (f"{ORG}/core/tree/r24.10/include/triton", None),
    (f"{ORG}/core/blob/r24.10/src", None),  # GitHub redirects blob/ on a folder to tree/
    (f"{ORG}/core/blob/r24.10/README.md#building-1", None),
    (f"{ORG}/core/blob/r24.10/src/modle.cc", "src/modle.cc does not exist in core@r24.10"),
    (f"{ORG}/core/blob/r24.10/src/model.cc#L100-L121", "past the end of src/model.cc (120 lines"),
    (f"{ORG}/core/blob/r24.10/src/model.cc#L130", "past the end"),
    (f"{ORG}/core/blob/r24.10/src/model.cc#L20-L10", "not a line range"),
    (f"{ORG}/core/blob/r24.10/README.md#building-2", "#building-2 is not a heading of README.md"),
    (f"{ORG}/core/blob/r24.10/src/model.cc#ModelInit", "not markdown"),
    (f"{ORG}/core/tree/r24.10/src/model.cc", "tree/ link to a file"),
    (f"{ORG}/core/blob/r24.10/qa/L0_foo/test.sh", "qa/ of core@r24.10 is not listed"),
    (f"{ORG}/server/blob/r24.10/README.md", "server@r24.10 is not indexed"),
    (f"{ORG}/core/blob/r23.01/README.md", "core@r23.01 is not indexed"),
])
def test_a_bad_link_is_reported(url: str, expected: str | None) -> None:
    link = upstream_index.parse(url, "fabricated")
    assert link is not None, url
    problems = upstream_index.check_link(link, FAKE_INDEX)
    if expected is None:
        assert problems == [], problems
    else:
        assert len(problems) == 1 and expected in problems[0], (url, problems)


def test_a_main_link_is_reported_and_checked_at_the_release() -> None:
    link = upstream_index.parse(f"{ORG}/core/blob/main/src/model.cc#L1-L2", "fabricated")
    assert link.index_ref == upstream_index.RELEASE == "r24.10"
    assert f"uses main: link r24.10 (Triton 2.51), {ORG}/core/blob/r24.10/src/model.cc#L1-L2," in \
        upstream_index.check_ref(link)[0]
    assert upstream_index.check_link(link, FAKE_INDEX) == []


def test_links_are_read_from_notebook_cells_and_text(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        f"See [x]({ORG}/core/blob/r24.10/src/model.cc#L3-L4), and {ORG}/core/tree/r24.10/src.\n"
        f"A template is skipped: {ORG}/core/blob/{{RELEASE}}/README.md\n")
    found = upstream_index.find_links(tmp_path)
    assert [(link.kind, link.path, link.anchor, link.where) for link in found] == [
        ("blob", "src/model.cc", "L3-L4", "docs/a.md"), ("tree", "src", "", "docs/a.md")]


def test_github_heading_anchors() -> None:
    markdown = "\n".join([
        "<!--", "# Copyright, not a heading", "-->",
        "# Python Backend", "## `auto_complete_config`", "### Decoupled mode",
        "## Business Logic Scripting", "```bash", "# a shell comment", "```",
        "## Business Logic Scripting", "## `pb_utils.Tensor.to_dlpack() -> PyCapsule`",
        "## [Linked](https://example.com) & __bold__ title", "Setext heading", "---",
        '<a name="custom-anchor"></a>', "```not-a-fence``` inline code",
        "## After the inline code",
    ])
    assert upstream_index.headings(markdown) == [
        "python-backend", "auto_complete_config", "decoupled-mode", "business-logic-scripting",
        "business-logic-scripting-1", "pb_utilstensorto_dlpack---pycapsule", "linked--bold-title",
        "setext-heading", "custom-anchor", "after-the-inline-code",
    ]
