"""The dashboard and the flow graph in the admin's light and dark themes
(docs/howto/operate.md#the-dashboard): chosen with Django's theme toggle
(its choice kept in ``localStorage``) and by the system's
``prefers-color-scheme`` under the toggle's "auto"; every text of the page
reads at WCAG AA contrast (4.5:1) against what is behind it, and the
charts' marks (bars, lines) stand 3:1 off the page's background; no
console errors (the ``admin`` fixture checks)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from echomq_django.admin.pages import job_url
from tests.e2e.test_admin_dashboard import URL as DASHBOARD
from tests.e2e.test_admin_dashboard import workload  # noqa: F401  (a fixture)
from tests.e2e.test_admin_flow_graph import (
    QUEUE,
    ROOT,
    graph,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.e2e

# (what the toggle keeps, the system's scheme) -> the theme the page shows
THEMES = {
    "light": ("light", "dark"),  # chosen light wins over a dark system
    "dark": ("dark", "light"),
    "auto-dark": ("auto", "dark"),  # auto follows the system
}

# WCAG 2.1 relative luminance and contrast, on the page's computed colours;
# a colour is the first opaque background up the tree (the body's at last)
CONTRAST_JS = """
([scope, marks]) => {
  const parts = c => c.match(/[\\d.]+/g).map(Number);
  const lum = c => {
    const [r, g, b] = parts(c).slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const opaque = c => { const p = parts(c); return p.length < 4 || p[3] > 0.5; };
  const behind = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = getComputedStyle(e).backgroundColor;
      if (opaque(c)) return c;
    }
    return getComputedStyle(document.documentElement).backgroundColor;
  };
  const ratio = (a, b) => {
    const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const low = [];
  for (const el of document.querySelectorAll(scope + " *")) {
    const text = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const style = getComputedStyle(el);
    if (!text || !el.getClientRects().length || style.visibility === "hidden") continue;
    if (el.closest("svg")) continue;
    const r = ratio(style.color, behind(el));
    if (r < 4.5) low.push(`${el.tagName}.${el.className} ${style.color} on ${behind(el)}: `
                          + r.toFixed(2));
  }
  for (const el of document.querySelectorAll(marks)) {
    const style = getComputedStyle(el);
    const paint = style.fill !== "none" ? style.fill : style.stroke;
    const r = ratio(paint, behind(el.closest("svg")));
    if (r < 3) low.push(`${el.tagName}.${el.getAttribute("class")} ${paint}: ${r.toFixed(2)}`);
  }
  return [...new Set(low)];  // one line per kind of element and colours
}
"""


def open_in(admin, theme: str, path: str):
    """``path`` with the toggle's ``theme`` kept and the system's scheme."""
    kept, system = THEMES[theme]
    page = admin.page
    page.emulate_media(color_scheme=system)
    page.add_init_script(f"localStorage.setItem('theme', '{kept}')")
    page = admin.visit(path)
    expect(page.locator("html")).to_have_attribute("data-theme", kept)
    return page


def background_is(page, colour: str) -> None:
    """The page's background becomes ``colour`` (polled: a toggle's CSS
    applies on the next style pass)."""
    expect(page.locator("body")).to_have_css("background-color", colour)


SHOT_THEMES = ("light", "dark")  # the docs show these: dashboard-<theme>, flow-graph-<theme>
DARK_BG, LIGHT_BG = "rgb(18, 18, 18)", "rgb(255, 255, 255)"  # Django's --body-bg


@pytest.mark.parametrize("theme", THEMES)
def test_the_dashboard_reads_in_both_themes(admin, workload, theme):  # noqa: F811
    page = open_in(admin, theme, DASHBOARD + "?queue=notifications-outbound-email")
    background_is(page, LIGHT_BG if theme == "light" else DARK_BG)
    page.locator("details.emq-dash-table summary").click()
    marks = "#content-main svg rect, #content-main svg polyline"
    low = page.evaluate(CONTRAST_JS, ["#content-main", marks])
    assert low == [], "\n".join(low)
    if theme in SHOT_THEMES:
        admin.shot(f"dashboard-{theme}")


@pytest.mark.parametrize("theme", THEMES)
def test_the_flow_graph_reads_in_both_themes(admin, graph, theme):  # noqa: F811
    page = open_in(admin, theme, job_url(QUEUE, ROOT))
    background_is(page, LIGHT_BG if theme == "light" else DARK_BG)
    closed = page.locator(".emq-tree details:not([open]) > summary")
    for _ in range(closed.count()):  # unfold every part: all 40 nodes show
        closed.first.click()
    expect(page.locator(".emq-tree li.emq-node")).to_have_count(39)  # the root is the page
    marks = ".emq-statebar svg rect, .emq-timeline svg rect"
    low = page.evaluate(CONTRAST_JS, ["#content-main", marks])
    assert low == [], "\n".join(low)
    if theme in SHOT_THEMES:
        # the children's bar and the tree at the top of the picture (the page is long)
        page.evaluate("document.querySelector('.emq-statebar').scrollIntoView()")
        page.evaluate("window.scrollBy(0, -60)")
        admin.shot(f"flow-graph-{theme}", full_page=False)


def test_the_toggle_switches_the_dashboard_without_a_reload(admin, workload):  # noqa: F811
    page = open_in(admin, "light", DASHBOARD)
    page.locator("button.theme-toggle").first.click()  # light -> dark (a dark system)
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    background_is(page, DARK_BG)
    # every colour follows on its own style pass (and the page may swap its
    # body in a refresh meanwhile): the check settles within a few seconds
    for _ in range(30):
        low = page.evaluate(CONTRAST_JS, ["#content-main", "#content-main svg rect"])
        if not low:
            break
        page.wait_for_timeout(100)
    assert low == [], "\n".join(low)
