"""Index the upstream Triton trees this project links, so a test can prove every link resolves.

Why: the notebooks, docs and code comments point learners at Triton's own sources and documents on
GitHub (``github.com/triton-inference-server/<repo>/blob/<ref>/<path>#<anchor>``), often at exact
lines (``#L574-L602``) or headings (``#ensemble-models``). A renamed file, a line range past the end
of the file or a heading that does not exist is a broken lesson, and a link to ``main`` drifts away
from Triton 2.51, the server the workbench runs. Checking on the network would be slow and flaky, so
this script reads public mirrors once and commits what a link needs to be checked offline:

``tests/data/upstream_index/<repo>@<ref>.json``, one per linked tree, holding the commit indexed, the
files of the tree (in full, except top-level folders no link enters: those are named under
``unlisted``), the line count of every linked file and the GitHub heading anchors of every linked
markdown file. ``tests/test_upstream_links.py`` checks every link against it, with no network and no
mirror.

Regenerate (after adding or changing a link; the test says when):

    .venv/bin/python scripts/upstream_index.py            # rewrite the index, list broken links
    .venv/bin/python scripts/upstream_index.py --check    # compare with the committed index only

Mirrors: a bare clone of each linked repository, found under ``--mirrors`` (default
``$UPSTREAM_MIRRORS`` or ``/work/.mirror``) as ``triton-inference-server+<repo>/repo``,
``<repo>.git`` or ``<repo>``; ``--clone`` makes a missing one with ``git clone --bare`` from
GitHub. A link to ``main``/``master`` is indexed at ``RELEASE`` (the ref it should use) unless it is
in ``BRANCH_REF_ALLOWLIST``; the test rejects it either way until it is changed or allowlisted.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
INDEX_DIR = ROOT / "tests" / "data" / "upstream_index"
ORG_URL = "https://github.com/triton-inference-server"
RELEASE = "r24.10"  # the release branch of Triton 2.51.0, the server this workbench embeds
BRANCH_REFS = ("main", "master")

#: Links allowed to use a moving branch, each with the reason (something that does not exist at
#: RELEASE). Keys are full URLs. Keep it empty unless a lesson truly needs a newer upstream file.
BRANCH_REF_ALLOWLIST: dict[str, str] = {}

#: Where links are looked for: (folder or file, glob). Notebooks are read cell by cell (sources only).
SCAN = (
    ("README.md", ""),
    ("docs", "**/*.md"),
    ("notebooks", "*.ipynb"),
    ("notebooks", "**/*.py"),
    ("notebooks", "**/*.c"),
    ("lab_backends", "**/*.py"),
    ("c_backends", "**/*"),
    ("backends", "**/*"),
    ("model_repository", "**/*"),
    ("model_repository_gpu", "**/*"),
    ("deploy", "**/*"),
    ("docker", "**/*"),
    ("scripts", "**/*.py"),
    ("tests", "**/*.py"),
)
SKIP_PARTS = {".ipynb_checkpoints", "__pycache__", "artifacts"}
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".cc", ".cpp", ".txt", ".pbtxt", ".yaml", ".yml", ".sh", ".cmake",
                 ".toml", ".cfg", ""}

LINK = re.compile(
    r"https?://github\.com/triton-inference-server/(?P<repo>[A-Za-z0-9_.-]+)/(?P<kind>blob|tree)/"
    r"(?P<ref>[^/\s)\]#\"'<>`,]+)(?:/(?P<path>[^\s)\]#\"'<>`,]*))?(?:#(?P<anchor>[^\s)\]\"'<>`,]*))?"
)
LINE_ANCHOR = re.compile(r"L(\d+)(?:C\d+)?(?:-L(\d+)(?:C\d+)?)?")


@dataclass(frozen=True)
class Link:
    url: str
    repo: str
    kind: str  # blob | tree
    ref: str
    path: str  # "" for the tree's root
    anchor: str  # "" for none
    where: str  # file (and notebook cell) it was found in

    @property
    def index_ref(self) -> str:
        """The ref this link is checked at: RELEASE for a not-allowlisted main/master link."""
        if self.ref in BRANCH_REFS and self.url not in BRANCH_REF_ALLOWLIST:
            return RELEASE
        return self.ref


def parse(url: str, where: str = "") -> Link | None:
    """A Link for one upstream URL, or None if it is not a blob/tree link of triton-inference-server."""
    match = LINK.fullmatch(url)
    if not match:
        return None
    path = unquote((match["path"] or "").rstrip("./"))
    return Link(url, match["repo"], match["kind"], match["ref"], path, unquote(match["anchor"] or ""), where)


def links_in_text(text: str, where: str) -> list[Link]:
    out = []
    for match in LINK.finditer(text):
        url = match.group(0).rstrip(".:;")
        if "{" in url or "}" in url:  # an f-string template: its expansions are collected elsewhere
            continue
        link = parse(url, where)
        if link:
            out.append(link)
    return out


def _files(root: Path, exclude: set[Path]) -> list[Path]:
    out = []
    for top, pattern in SCAN:
        base = root / top
        found = [base] if not pattern else sorted(base.glob(pattern)) if base.is_dir() else []
        for path in found:
            if path.is_file() and path.suffix in TEXT_SUFFIXES | {".ipynb"} and path.resolve() not in exclude \
                    and not SKIP_PARTS & set(path.relative_to(root).parts):
                out.append(path)
    return list(dict.fromkeys(out))


def find_links(root: Path = ROOT, exclude: tuple[Path, ...] = ()) -> list[Link]:
    """Every upstream link in the project's notebooks (cell sources), docs, README and code.

    Also the rendered ``lab_backends.lessons.further_reading.LINKS``, whose source builds its URLs
    with f-strings the text scan skips.
    """
    skip = {Path(p).resolve() for p in exclude}
    links: list[Link] = []
    for path in _files(root, skip):
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            for number, cell in enumerate(cells):
                source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                links += links_in_text(source, f"{rel} cell {number}")
        else:
            try:
                links += links_in_text(path.read_text(encoding="utf-8"), rel)
            except UnicodeDecodeError:
                continue
    if root == ROOT:
        sys.path.insert(0, str(ROOT))
        from lab_backends.lessons.further_reading import LINKS

        for key, rows in LINKS.items():
            for _, url, _ in rows:
                link = parse(url, f"lab_backends/lessons/further_reading.py LINKS[{key!r}]")
                if link:
                    links.append(link)
    return links


# --- markdown headings, the GitHub way ----------------------------------------------------------

# Any indent (fences inside list items are common); a backtick fence has no backtick after it.
_FENCE = re.compile(r"^\s*(?:(`{3,})[^`]*|(~{3,}).*)$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)


def _plain(text: str) -> str:
    """The rendered text of a heading: markdown links, images, emphasis and HTML tags removed."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    parts = re.split(r"(`+[^`]*`+)", text)
    for i, part in enumerate(parts):
        if part.startswith("`"):
            parts[i] = part.strip("`")
        else:
            part = re.sub(r"(?<![\w\\])_+|_+(?!\w)", "", part)  # _emphasis_, not snake_case
            parts[i] = part.replace("\\", "")
    return html.unescape("".join(parts)).strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lowercase, punctuation but - and _ dropped,
    each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", _plain(text).lower()).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """Every anchor GitHub makes in a markdown file: headings (repeats get -1, -2, ...) and <a name>."""
    seen: dict[str, int] = {}
    anchors: list[str] = []

    def add(text: str) -> None:
        base = slug(text)
        name, n = base, seen.get(base, 0)
        while name in seen:
            n += 1
            name = f"{base}-{n}"
        seen[base] = n
        seen[name] = 0
        anchors.append(name)

    fence = ""
    previous = ""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
    for line in markdown.splitlines():
        opened = _FENCE.match(line)
        marker = (opened.group(1) or opened.group(2)) if opened else ""
        if fence:
            if marker and marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip(" `~"):
                fence = ""
            previous = ""
            continue
        if marker:
            fence, previous = marker, ""
            continue
        anchors += [a for a in _HTML_ANCHOR.findall(line) if a not in anchors]
        atx = _ATX.match(line)
        if atx:
            add(atx.group(2) or "")
            previous = ""
            continue
        if previous.strip() and _SETEXT.match(line) and not previous.lstrip().startswith(("-", "*", "+", ">", "|")):
            add(previous.strip())
            previous = ""
            continue
        previous = line
    return anchors


def line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


# --- checking a link against the index -----------------------------------------------------------

def load_index(directory: Path = INDEX_DIR) -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(directory.glob("*@*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[(data["repo"], data["ref"])] = data
    return out


def directories(tree: dict) -> set[str]:
    dirs = {""} | {d for d in tree.get("unlisted", [])}
    for path in tree["files"]:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return dirs


REGENERATE = "run `.venv/bin/python scripts/upstream_index.py` to index it"


def check_link(link: Link, index: dict[tuple[str, str], dict]) -> list[str]:
    """What is wrong with one link, checked at its index ref (empty if it resolves)."""
    ref = link.index_ref
    tree = index.get((link.repo, ref))
    if tree is None:
        return [f"{link.repo}@{ref} is not indexed: {REGENERATE}"]
    path = link.path
    files = set(tree["files"])
    dirs = directories(tree)
    top = path.split("/", 1)[0]
    if path not in files and path not in dirs:
        if top in tree.get("unlisted", []):
            return [f"{top}/ of {link.repo}@{ref} is not listed in the index: {REGENERATE}"]
        return [f"{path or '/'} does not exist in {link.repo}@{ref}"]
    if link.kind == "tree" and path in files:
        return [f"tree/ link to a file ({path}): use blob/"]
    # A blob/ link to a folder is fine: GitHub redirects it to tree/.
    if not link.anchor:
        return []
    if path not in files:
        return [f"#{link.anchor} on a folder ({path or '/'})"]
    lines = tree["lines"].get(path)
    line_anchor = LINE_ANCHOR.fullmatch(link.anchor)
    if line_anchor:
        if lines is None:
            return [f"the line count of {path} is not in the index: {REGENERATE}"]
        first, last = int(line_anchor[1]), int(line_anchor[2] or line_anchor[1])
        if not 1 <= first <= last:
            return [f"#{link.anchor}: not a line range (first line 1, first <= last)"]
        if last > lines:
            return [f"#{link.anchor} is past the end of {path} ({lines} lines at {ref})"]
        return []
    if not path.lower().endswith((".md", ".markdown")):
        return [f"#{link.anchor}: {path} is not markdown, only #L<n>[-L<m>] anchors resolve"]
    anchors = tree["headings"].get(path)
    if anchors is None:
        return [f"the headings of {path} are not in the index: {REGENERATE}"]
    if link.anchor.lower() not in {a.lower() for a in anchors}:
        near = [a for a in anchors if link.anchor.lower()[:6] in a.lower()][:5]
        return [f"#{link.anchor} is not a heading of {path} at {ref}" + (f" (near: {', '.join(near)})" if near else "")]
    return []


def check_ref(link: Link) -> list[str]:
    if link.ref in BRANCH_REFS and link.url not in BRANCH_REF_ALLOWLIST:
        fixed = link.url.replace(f"/{link.kind}/{link.ref}", f"/{link.kind}/{RELEASE}", 1)
        return [f"uses {link.ref}: link {RELEASE} (Triton 2.51), {fixed}, or allowlist it in "
                "scripts/upstream_index.py BRANCH_REF_ALLOWLIST with the reason"]
    return []


def problems(links: list[Link], index: dict[tuple[str, str], dict]) -> list[str]:
    out = []
    for link in links:
        for problem in check_ref(link) + check_link(link, index):
            out.append(f"{link.where}: {link.url}\n    {problem}")
    return out


# --- building the index from mirrors -------------------------------------------------------------

def mirror(repo: str, mirrors: Path, clone: bool) -> Path:
    for candidate in (mirrors / f"triton-inference-server+{repo}" / "repo", mirrors / f"{repo}.git", mirrors / repo):
        if (candidate / "HEAD").exists() or (candidate / ".git").exists():
            return candidate
    if not clone:
        raise SystemExit(f"no mirror of {repo} under {mirrors}: pass --clone, or "
                         f"`git clone --bare {ORG_URL}/{repo}.git {mirrors / (repo + '.git')}`")
    target = mirrors / f"{repo}.git"
    subprocess.run(["git", "clone", "--bare", f"{ORG_URL}/{repo}.git", str(target)], check=True)
    return target


def git(repo_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo_dir), *args], check=True, capture_output=True,
                          text=True, encoding="utf-8", errors="replace").stdout


def build_tree(repo: str, ref: str, linked: set[str], repo_dir: Path) -> dict:
    """The index of one tree: its files (under the top-level folders links enter), line counts and
    headings of the linked files."""
    try:
        commit = git(repo_dir, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"{repo_dir} has no ref {ref}: fetch it into the mirror first") from None
    every = git(repo_dir, "ls-tree", "-r", "--name-only", "-z", commit).split("\0")
    every = sorted(p for p in every if p)
    tops = {p.split("/", 1)[0] for p in every if "/" in p}
    entered = {p.split("/", 1)[0] for p in linked} & tops
    files = [p for p in every if "/" not in p or p.split("/", 1)[0] in entered]
    lines, heads = {}, {}
    for path in sorted(linked & set(every)):
        text = git(repo_dir, "show", f"{commit}:{path}")
        lines[path] = line_count(text)
        if path.lower().endswith((".md", ".markdown")):
            heads[path] = headings(text)
    return {"repo": repo, "ref": ref, "commit": commit, "source": f"{ORG_URL}/{repo}/tree/{ref}",
            "unlisted": sorted(tops - entered), "files": files, "lines": lines, "headings": heads}


def dump(tree: dict) -> str:
    """Compact but diff-friendly JSON: one file per line."""

    def block(rows: list[str], open_: str, close: str) -> str:
        return open_ + "".join(f"\n  {row}," for row in rows).rstrip(",") + ("\n " if rows else "") + close

    entries = {k: json.dumps(tree[k]) for k in ("repo", "ref", "commit", "source", "unlisted")}
    entries["files"] = block([json.dumps(p) for p in tree["files"]], "[", "]")
    entries["lines"] = block([f"{json.dumps(p)}: {n}" for p, n in sorted(tree["lines"].items())], "{", "}")
    entries["headings"] = block([f"{json.dumps(p)}: {json.dumps(a)}" for p, a in sorted(tree["headings"].items())],
                                "{", "}")
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {v}" for k, v in entries.items()) + "\n}\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed index, write nothing")
    parser.add_argument("--mirrors", type=Path, default=Path(os.environ.get("UPSTREAM_MIRRORS", "/work/.mirror")))
    parser.add_argument("--clone", action="store_true", help="git clone --bare a missing mirror from GitHub")
    args = parser.parse_args(argv)

    links = find_links(exclude=(ROOT / "tests" / "test_upstream_links.py",))
    wanted: dict[tuple[str, str], set[str]] = {}
    for link in links:
        wanted.setdefault((link.repo, link.index_ref), set()).add(link.path)
    texts = {}
    for (repo, ref), paths in sorted(wanted.items()):
        tree = build_tree(repo, ref, paths, mirror(repo, args.mirrors, args.clone))
        texts[INDEX_DIR / f"{repo}@{ref}.json"] = dump(tree)
    stale = [p for p in INDEX_DIR.glob("*@*.json") if p not in texts]
    changed = [p for p, text in texts.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    rel = [p.relative_to(ROOT).as_posix() for p in changed + stale]
    if args.check:
        if rel:
            print("index out of date (run scripts/upstream_index.py): " + ", ".join(rel))
    else:
        INDEX_DIR.mkdir(parents=True, exist_ok=True)
        for path in changed:
            path.write_text(texts[path], encoding="utf-8")
        for path in stale:
            path.unlink()
        print(f"indexed {len(texts)} trees for {len(links)} links"
              + (f"; wrote/removed {', '.join(rel)}" if rel else "; index unchanged"))
    index = {(json.loads(t)["repo"], json.loads(t)["ref"]): json.loads(t) for t in texts.values()}
    found = problems(links, index)
    for problem in found:
        print(problem)
    return 1 if found or (args.check and rel) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
