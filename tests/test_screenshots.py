"""The docs' screenshots (docs/howto/operate.md#the-admin-in-a-browser) stay
current: ``scripts/screenshots.sh`` makes them from the browser tests it
runs, into docs/_static/screenshots; here, without a browser, the folder
holds exactly the pictures the docs pages show, each one a PNG that one
of those tests writes (``admin.shot``), at the tests' viewport width."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from tests.support.browserkit import VIEWPORT

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "docs" / "_static" / "screenshots"
SCRIPT = ROOT / "scripts" / "screenshots.sh"


def shown() -> set[str]:
    """The screenshot names the docs pages show."""
    names = set()
    for page in (ROOT / "docs").rglob("*.md"):
        names.update(re.findall(r"_static/screenshots/([\w.-]+)\.png", page.read_text()))
    return names


def written() -> set[str]:
    """The names the script's browser tests pass to ``admin.shot``, a
    ``{theme}`` in a name expanded over the test's ``SHOT_THEMES``."""
    tests = re.findall(r"tests/e2e/\w+\.py", SCRIPT.read_text())
    assert tests, "scripts/screenshots.sh names no browser test"
    names = set()
    for test in tests:
        text = (ROOT / test).read_text()
        themes = re.search(r"SHOT_THEMES = \(([^)]*)\)", text)
        for name in re.findall(r'admin\.shot\(f?"([\w{}.-]+)"', text):
            if "{theme}" in name:
                assert themes, f"{test}: {name} needs SHOT_THEMES"
                names.update(name.replace("{theme}", t) for t in re.findall(r'"(\w+)"', themes[1]))
            else:
                names.add(name)
    return names


def test_the_folder_holds_exactly_what_the_docs_show():
    assert {p.stem for p in SHOTS.glob("*.png")} == shown()
    assert sorted(p.name for p in SHOTS.iterdir() if p.suffix != ".png") == []


def test_every_shown_screenshot_is_one_the_script_makes():
    assert shown() - written() == set()


def test_each_is_a_png_of_the_browser_tests_width():
    for png in sorted(SHOTS.glob("*.png")):
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n", png.name
        width, height = struct.unpack(">II", head[16:24])
        assert (png.name, width) == (png.name, VIEWPORT["width"])
        assert height >= 600, (png.name, height)
