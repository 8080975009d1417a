"""The dashboard (docs/howto/operate.md#the-dashboard): every queue at a
glance, read live from Redis: its jobs by state, the oldest pending job's
wait, its live workers and the last minute's throughput (``monitoring/
stats.py``'s numbers), and a chart of its per-minute counters (added,
completed, failed, dead: ``mq.probes.minute_counts``) over the last hour
or day, as server-side SVG with a table twin. ``dashboard_json`` is what
the page's script fetches to refresh itself without a reload.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from ..monitoring.stats import GROUP_ROWS, collect
from ..protocol.probes import MINUTES_KEPT
from .display import jobs_url

RANGES = {"hour": 60, "day": MINUTES_KEPT}  # ?range= -> minutes shown
REFRESH_S = 10  # s between the page's refreshes
COLUMNS = 60  # columns a chart draws at most: a day is 60 columns of 24 minutes
WIDTH, HEIGHT = 600, 60  # SVG user units of a chart (it stretches to the width)
KINDS = ("added", "completed", "failed", "dead")
STACKED = ("completed", "failed", "dead")  # the columns; added is the line


class BadRange(ValueError):
    """A ``range`` the counters do not keep."""


def minutes_of(value: str | None) -> int:
    """The minutes ``?range=`` asks for (None: the hour). Raises
    ``BadRange`` naming the kept ranges."""
    if value is None or value == "":
        return RANGES["hour"]
    if value not in RANGES:
        raise BadRange(
            f"range {value!r}: the counters keep the last {MINUTES_KEPT} minutes; "
            f"ask for one of: {', '.join(RANGES)}"
        )
    return RANGES[value]


def _num(value: float) -> str:
    return f"{value:.1f}"


def chart(rows: list[dict]) -> dict:
    """One queue's chart from its per-minute rows (oldest first): ``{cols:
    [{minute, minutes, added, completed, failed, dead, rects: [{kind, x, y,
    width, height}]}], active (the cols with a count, each with ``label``,
    its first minute as UTC text), bars (the rects as safe SVG text), line
    (SVG points of added), table (the active cols as safe table rows),
    peak, totals}``; minutes are summed into at most
    ``COLUMNS`` columns (``minute``: the first, in minutes since the epoch),
    heights scaled to the busiest column, coordinates as text."""
    per = max(1, math.ceil(len(rows) / COLUMNS))
    cols = []
    for i in range(0, len(rows), per):
        group = rows[i : i + per]
        col = {"minute": group[0]["minute"], "minutes": sum(r.get("minutes", 1) for r in group)}
        col.update((k, sum(r[k] for r in group)) for k in KINDS)
        cols.append(col)
    peak = max([1] + [max(sum(c[k] for k in STACKED), c["added"]) for c in cols])
    step = WIDTH / max(len(cols), 1)
    points = []
    for i, col in enumerate(cols):
        x, bottom, rects = i * step, float(HEIGHT), []
        for kind in STACKED:
            if col[kind]:
                height = HEIGHT * col[kind] / peak
                bottom -= height
                rects.append(
                    {
                        "kind": kind,
                        "x": _num(x + step * 0.1),
                        "y": _num(bottom),
                        "width": _num(step * 0.8),
                        "height": _num(height),
                    }
                )
        col["rects"] = rects
        points.append(f"{_num(x + step / 2)},{_num(HEIGHT - HEIGHT * col['added'] / peak)}")
    totals = {k: sum(c[k] for c in cols) for k in KINDS}
    # the table twin lists the columns with a count (a quiet hour is one line)
    active = [c for c in cols if any(c[k] for k in KINDS)]
    for col in active:
        col["label"] = datetime.fromtimestamp(col["minute"] * 60, UTC).strftime("%Y-%m-%d %H:%M")
    # the columns as SVG and the table twin's rows, joined here: a template
    # loop or a format_html per rect costs more than the rest of the page
    # (docs/howto/operate.md#the-dashboard). Safe as they are: every value
    # is a number formatted here, a kind from STACKED or a strftime label.
    bars = mark_safe(
        "".join(
            f'<rect class="emq-fill-{r["kind"]}" x="{r["x"]}" y="{r["y"]}" '
            f'width="{r["width"]}" height="{r["height"]}"/>'
            for c in cols
            for r in c["rects"]
        )
    )
    table = mark_safe(
        "".join(
            f"<tr><td>{c['label']}</td><td>{c['minutes']}</td>"
            + "".join(f"<td>{c[k]}</td>" for k in KINDS)
            + "</tr>"
            for c in active
        )
    )
    return {
        "cols": cols,
        "bars": bars,
        "table": table,
        "active": active,
        "line": " ".join(points),
        "peak": peak,
        "totals": totals,
    }


def dashboard(mq, queues=(), minutes: int = 60) -> dict:
    """The page's context: ``{at (ms), minutes, now_minute, queues: [{name,
    url, stats (stats.queue_stats + workers), chart, groups}]}`` for ``queues``
    (names; empty: every known queue). Raises ``UnknownQueue`` naming the
    known queues, ``ValueError``, ``RedisUnavailable``. Every queue is read
    in one bulk read (``mq.probes.overview``), a fixed number of round
    trips whatever the number of queues."""
    # one bulk read, the charts' rows too: a range longer than COLUMNS
    # minutes is summed into its columns on the server (lua/sum_minutes.lua)
    stats = collect(mq, queues, minutes=minutes, per=math.ceil(minutes / COLUMNS))
    return {
        "at": stats["at"],
        "minutes": minutes,
        "now_minute": stats["now_minute"],
        "queues": [
            {
                "name": name,
                "url": jobs_url(name),
                "stats": entry,
                "chart": chart(entry.pop("minutes")),
                "groups": busiest_groups(entry["groups"]),
            }
            for name, entry in stats["queues"].items()
        ],
    }


def busiest_groups(groups: dict) -> list[dict]:
    """A queue's groups (stats' ``groups``) as rows ``{name, pending, active,
    paused, concurrency}``, the ``GROUP_ROWS`` with the most pending jobs
    first (docs/explanation/protocol.md#groups)."""
    rows = sorted(groups.items(), key=lambda item: (-item[1]["pending"], item[0]))
    return [{"name": name, **counts} for name, counts in rows[:GROUP_ROWS]]


def dashboard_json(ctx: dict) -> dict:
    """What the page's script fetches: the numbers (``queues``: name ->
    counts, ages, workers, throughput, and ``series``: the per-minute rows
    as ``[minute, added, completed, failed, dead]``) and ``html``, the
    page's body rendered again, which the script swaps in."""
    return {
        "at": ctx["at"],
        "minutes": ctx["minutes"],
        "queues": {
            q["name"]: {
                **q["stats"],
                "totals": q["chart"]["totals"],
                "series": [[c["minute"], *(c[k] for k in KINDS)] for c in q["chart"]["cols"]],
            }
            for q in ctx["queues"]
        },
        "html": render_to_string("admin/echomq_django/includes/dashboard_body.html", ctx),
    }
