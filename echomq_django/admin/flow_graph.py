"""The flow page's pictures (docs/howto/operate.md#the-flow-graph): the
tree's nodes marked with their state and the failing path, a parent's
children summarised by state as one bar, and a timeline of the page's
nodes (waited, ran, finished). Pure functions over what ``pages.job_page``
read already: no Redis call of their own, so their cost is bounded by the
page (``CHILDREN_PER_PAGE``, ``FANOUT``), whatever the fan-in. Drawn as
server-side SVG with a text or table twin, no JavaScript.
"""

from __future__ import annotations

from ..monitoring.stats import duration

TIMELINE_ROWS = 60  # nodes drawn on a page's timeline; the rest are counted
SCALE = 1000  # SVG user units across a bar (the bar stretches to the width)

# a parent's children by what they did to it (``dependency_counts``), in
# the order the bar draws them: (count key, words, colour class)
SUMMARY_PARTS = (
    ("processed", "completed", "completed"),
    ("failed", "failed the parent", "dead"),
    ("ignored", "died, ignored", "ignored"),
    ("removed", "removed", "removed"),
    ("unprocessed", "still to finish", "pending"),
)


def mark_failing(nodes: list[dict]) -> bool:
    """Mark the failing path in ``nodes`` (``pages.tree_nodes`` answers, in
    place): ``failing`` is True on a dead node and on every node above one,
    and ``open`` unfolds a parent whose subtree holds one, so the page opens
    on the way to the failure. Returns whether any node of ``nodes`` is
    failing."""
    found = False
    for node in nodes:
        below = mark_failing(node["children"])
        node["failing"] = node["state"] == "dead" or below
        node["open"] = below
        found = found or node["failing"]
    return found


def state_summary(counts: dict[str, int]) -> dict:
    """A parent's children as one stacked bar (``counts``:
    ``dependency_counts``): ``{total, label, parts: [{key, words, css, n,
    x, width, percent}]}``, x and width in ``SCALE`` units (text: a
    template must not localise them), parts with no
    child left out; ``label`` says it all in words for a screen reader.
    Reads nothing: a 10,000-child parent costs what a 3-child one does."""
    total = max(counts.get("children", 0), 0)
    parts, x = [], 0.0
    for key, words, css in SUMMARY_PARTS:
        n = counts.get(key, 0)
        if n <= 0 or not total:
            continue
        width = SCALE * n / total
        parts.append(
            {
                "key": key,
                "words": words,
                "css": css,
                "n": n,
                "x": _num(x),
                "width": _num(width),
                "percent": f"{100 * n / total:.0f}",
            }
        )
        x += width
    label = f"{total} children: " + ", ".join(f"{p['n']} {p['words']}" for p in parts)
    return {"total": total, "label": label, "parts": parts}


def _rows(root: dict, nodes: list[dict], depth: int = 0):
    """``(node, depth)`` for ``root`` and then ``nodes`` depth first."""
    if root is not None:
        yield root, 0
    for node in nodes:
        yield node, depth + 1
        yield from _rows(None, node["children"], depth + 1)


def timeline(root: dict, nodes: list[dict], now_ms: int) -> dict:
    """A timeline of the page's nodes: ``root`` (``{queue, id, url, state,
    created_at, started_at, finished_at}``, times in ms since the epoch or
    None) and ``nodes`` (``pages.tree_nodes`` answers, which carry the same
    times), depth first, ``TIMELINE_ROWS`` at most. ``now_ms`` (ms) ends
    what still waits or runs. Returns ``{rows, more, span}``: each row is
    the node plus ``depth``, ``waited`` / ``ran`` (``{x, width}`` in
    ``SCALE`` units as text, or None) and ``waited_text`` / ``ran_text`` (words,
    '-' when it has not); ``more`` counts nodes not drawn; ``span`` is the
    time the axis covers, in words. A node that has not started waited
    until now; one that has not finished runs until now."""
    every = list(_rows(root, nodes))
    shown = [(n, d) for n, d in every if n.get("created_at")][:TIMELINE_ROWS]
    if not shown:
        return {"rows": [], "more": len(every), "span": "-"}
    start = min(n["created_at"] for n, _ in shown)
    end = max(_end(n, now_ms) for n, _ in shown)
    length = max(end - start, 1)

    def box(a: int | None, b: int | None) -> dict | None:
        if a is None or b is None or b < a:
            return None
        # 2 units at least: an instant still shows
        return {
            "x": _num(SCALE * (a - start) / length),
            "width": _num(max(SCALE * (b - a) / length, 2)),
        }

    rows = []
    for node, depth in shown:
        created, started, finished = node["created_at"], node["started_at"], node["finished_at"]
        waited_to = started if started else (finished or now_ms)
        ran_to = (finished or now_ms) if started else None
        rows.append(
            {
                **node,
                "depth": depth,
                "waited": box(created, waited_to),
                "ran": box(started, ran_to),
                "waited_text": duration((waited_to - created) / 1000),
                "ran_text": duration((ran_to - started) / 1000) if started else "-",
            }
        )
    return {"rows": rows, "more": len(every) - len(rows), "span": duration(length / 1000)}


def _end(node: dict, now_ms: int) -> int:
    return node["finished_at"] or now_ms


def _num(value: float) -> str:
    """An SVG coordinate as text, the same in every locale."""
    return f"{value:.1f}"
