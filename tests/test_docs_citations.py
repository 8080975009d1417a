"""Every docs citation in the code names a page and a heading that exist.

Code cites the docs by path and heading anchor, ``docs/<page>.md#<anchor>``
(docs/explanation/house.md#the-rules). The docs site (Sphinx + MyST,
``myst_heading_anchors = 4``) gives every heading up to level 4 an anchor
computed like GitHub's: the heading's text, lowercased, with every character
that is not a word character, a space or a hyphen dropped, and each space
made a hyphen; a second heading with the same slug gets ``-1``, and so on.
This test computes the same slugs from the pages and checks every citation
in ``echomq_django/``, ``lua/``, ``tests/``, ``bench/`` and ``scripts/``
against them, naming each broken one as ``file:line -> target``. It also
checks that the package and the Lua scripts cite no design document
section and no issue number (the docs are what the code cites).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("echomq_django", "lua", "tests", "bench", "scripts")
# everything a reader of the checkout or the wheel has (not this file's own pattern)
NO_OLD_CITATIONS = (
    *SCANNED,
    "testproject",
    "docs",
    ".ci",
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
)
SUFFIXES = {".py", ".lua", ".html", ".css", ".js", ".sh", ".txt", ".toml", ".cfg", ".md"}
MAX_LEVEL = 4  # myst_heading_anchors

# "docs/" + a path ending ".md", then an optional "#anchor". Spelled in two
# parts so that this file's own text is no citation.
CITATION = re.compile("docs" + r"/([\w./-]+?\.md)(?:#([\w-]+))?(?![\w.-])")
OLD_CITATION = re.compile("DESIGN" + r"|[Ii]ssue #?[0-9]|(?i:design doc)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(title: str) -> str:
    """A heading's anchor, as MyST computes it (GitHub's rule)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def heading_text(markdown: str) -> str:
    """The text a heading shows: links as their text, no code or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text)


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings up to ``MAX_LEVEL``."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m or len(m.group(1)) > MAX_LEVEL:
            continue
        base = slug(heading_text(m.group(2)))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def scanned_files(folders):
    """Every text file under ``folders`` (relative to the repo), sorted."""
    for folder in folders:
        root = REPO / folder
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            # node_modules: bench/node's installed BullMQ, not our text (gitignored)
            skip = {"__pycache__", "_build", "node_modules"} & set(path.parts)
            skip = skip or path == Path(__file__)
            if path.is_file() and path.suffix in SUFFIXES and not skip:
                yield path


def citations():
    """``(file:line, page, anchor or None)`` for every docs citation."""
    for path in scanned_files(SCANNED):
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for m in CITATION.finditer(line):
                yield f"{path.relative_to(REPO)}:{number}", m.group(1), m.group(2)


def test_the_slug_rule():
    assert slug(heading_text("The host's clock")) == "the-hosts-clock"
    assert slug(heading_text("`core/`: the words")) == "core-the-words"
    assert slug(heading_text('"Not now" is not "no"')) == "not-now-is-not-no"
    assert slug(heading_text("Fan-in across slots")) == "fan-in-across-slots"
    assert slug(heading_text("`awaiting_children`")) == "awaiting_children"


def test_every_docs_citation_names_a_page_and_a_heading():
    cache: dict[str, set[str] | None] = {}
    broken = []
    count = 0
    for where, page, anchor in citations():
        count += 1
        if page not in cache:
            path = REPO / "docs" / page
            cache[page] = anchors(path) if path.is_file() else None
        target = f"docs/{page}" + (f"#{anchor}" if anchor else "")
        if cache[page] is None:
            broken.append(f"{where} -> {target} (no such page)")
        elif anchor and anchor not in cache[page]:
            broken.append(f"{where} -> {target} (no such heading)")
    assert count > 0, "no docs citation found: is the pattern right?"
    assert broken == [], "broken docs citations:\n" + "\n".join(broken)


def test_the_code_cites_no_design_section_and_no_issue_number():
    found = []
    for path in scanned_files(NO_OLD_CITATIONS):
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if OLD_CITATION.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == [], "cite docs/<page>.md#<anchor> instead:\n" + "\n".join(found)
