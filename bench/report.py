"""The terminal table, the our/their ratios and the issue's targets."""

from __future__ import annotations

COLUMNS = [  # title, width, row -> text
    ("topology", 20, lambda r: r["label"]),
    ("system", 6, lambda r: r["system"]),
    ("nodes", 6, lambda r: f"{r['nodes']:,}"),
    ("add ms", 8, lambda r: f"{r['add_ms']:,.1f}"),
    ("add n/s", 8, lambda r: f"{r['add_nodes_per_s']:,}"),
    ("resolve s", 9, lambda r: "-" if r["resolve_s"] is None else f"{r['resolve_s']:.3f}"),
    (
        "res n/s",
        7,
        lambda r: "-" if r["resolve_nodes_per_s"] is None else f"{r['resolve_nodes_per_s']:,}",
    ),
    ("B/node", 6, lambda r: f"{r['mem_bytes_per_node']:,.0f}"),
    ("RT/node", 7, lambda r: f"{r['round_trips_per_node']['total']:.3f}"),
    ("cmd/node", 8, lambda r: f"{sum(r['redis_commands_per_node'].values()):.1f}"),
    ("wkr us/n", 8, lambda r: f"{r['worker_cpu_us_per_node']:,.0f}"),
    ("rds us/n", 8, lambda r: f"{r['redis_cpu_us_per_node']['resolve']:,.0f}"),
    ("values", 10, lambda r: ("ok " if r["values_ok"] else "FAIL ") + f"{r['values_checked']:,}"),
]

LEGEND = """\
add n/s, res n/s: nodes per second; B/node: Redis memory per node after the add;
RT/node: round trips per node (add + resolve, counted by the server); cmd/node:
Redis commands per node, those run inside scripts included; wkr us/n, rds us/n:
CPU microseconds per node while resolving, of the worker processes and of Redis.
ratio rows: add and resolve are bullmq's time / ours (x faster); B/node and
RT/node are ours / bullmq's."""


def _line(cells) -> str:
    out = []
    for (title, width, _), cell in zip(COLUMNS, cells, strict=False):
        out.append(
            cell.ljust(width) if title in ("topology", "system", "values") else cell.rjust(width)
        )
    return "  ".join(out).rstrip()


def _pair(rows: list[dict], row: dict) -> dict | None:
    for other in rows:
        if other["topology"] == row["topology"] and other["system"] == "echomq":
            return other
    return None


def ratio(ours: dict, theirs: dict) -> dict:
    """How many times faster we are (their time / ours) and memory ours/theirs."""

    def div(a, b):
        return round(a / b, 2) if a and b else None

    return {
        "topology": ours["topology"],
        "label": ours["label"],
        "add_speedup": div(theirs["add_ms"], ours["add_ms"]),
        "resolve_speedup": div(theirs["resolve_s"], ours["resolve_s"]),
        "memory_ratio": div(ours["mem_bytes_per_node"], theirs["mem_bytes_per_node"]),
        "round_trip_ratio": div(
            ours["round_trips_per_node"]["total"], theirs["round_trips_per_node"]["total"]
        ),
    }


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        if row["system"] != "echomq":
            ours = _pair(rows, row)
            if ours:
                out.append(ratio(ours, row))
    return out


def format_table(
    rows: list[dict], first: bool = True, ratios_for=None, summary: bool = False
) -> str:
    lines = []
    if first:
        lines.append(_line([c[0] for c in COLUMNS]))
        lines.append(_line(["-" * c[1] for c in COLUMNS]))
    for row in rows:
        cells = [fn(row) for _, _, fn in COLUMNS]
        if summary and lines and row["system"] != "echomq":
            cells[0] = ""
        lines.append(_line(cells))
        if row["system"] != "echomq" and ratios_for:
            ours = _pair(ratios_for, row)
            if ours:
                r = ratio(ours, row)

                def fmt(v, s="x"):
                    return "-" if v is None else f"{v:g}{s}"

                lines.append(
                    _line(
                        [
                            "",
                            "ratio",
                            "",
                            fmt(r["add_speedup"]),
                            "faster",
                            fmt(r["resolve_speedup"]),
                            "faster",
                            fmt(r["memory_ratio"], ""),
                            fmt(r["round_trip_ratio"], ""),
                            "",
                            "",
                            "",
                            "",
                        ]
                    )
                )
    if summary:
        lines.append(LEGEND)
    for row in rows:
        if row["problems"]:
            lines.append(f"  {row['system']} {row['label']}: " + "; ".join(row["problems"][:5]))
    return "\n".join(lines)


def evaluate_targets(rows: list[dict]) -> dict:
    """The targets (docs/explanation/performance.md#results), on this run's
    rows (None when a row is missing)."""
    by = {(r["system"], r["topology"]): r for r in rows}
    ours10k, theirs10k = by.get(("echomq", "wide-10000")), by.get(("bullmq", "wide-10000"))
    ours1k = by.get(("echomq", "wide-1000"))
    t: dict = {}
    if ours10k and theirs10k:
        r = ratio(ours10k, theirs10k)
        t["add_10k_10x_faster"] = {"value": r["add_speedup"], "met": (r["add_speedup"] or 0) >= 10}
        t["resolve_10k_3x_faster"] = {
            "value": r["resolve_speedup"],
            "met": (r["resolve_speedup"] or 0) >= 3,
        }
    # per-node memory of the large flows: a small flow's few tens of KB of
    # fixed cost (per-queue keys, the first stream node) dominate its figure
    ours_rows = [r for r in rows if r["system"] == "echomq" and r["nodes"] >= 2000]
    if ours_rows:
        worst = max(ours_rows, key=lambda r: r["mem_bytes_per_node"])
        t["memory_450_bytes_per_node"] = {
            "value": worst["mem_bytes_per_node"],
            "worst": worst["topology"],
            "met": worst["mem_bytes_per_node"] <= 450,
        }
    if ours10k and ours1k:
        for what in ("add_nodes_per_s", "resolve_nodes_per_s"):
            a, b = ours10k[what], ours1k[what]
            if a and b:
                t[f"linear_{what}"] = {"value": round(a / b, 3), "met": abs(a / b - 1) <= 0.2}
    lines = ["targets:"]
    names = {
        "add_10k_10x_faster": "add 1+10,000 >= 10x faster than bullmq",
        "resolve_10k_3x_faster": "resolve 1+10,000 >= 3x faster than bullmq",
        "memory_450_bytes_per_node": (
            "<= 450 B of Redis memory per node (worst flow >= 2,000 nodes)"
        ),
        "linear_add_nodes_per_s": "add nodes/s at 10,000 within 20% of 1,000",
        "linear_resolve_nodes_per_s": "resolve nodes/s at 10,000 within 20% of 1,000",
    }
    for key, label in names.items():
        if key in t:
            v = t[key]["value"]
            shown = f"{v:g}" + (
                "x" if "faster" in key else "" if "memory" in key else "x the 1,000 figure"
            )
            if "memory" in key:
                shown += f" B ({t[key]['worst']})"
            lines.append(f"  {'MET ' if t[key]['met'] else 'MISSED'} {label}: {shown}")
        else:
            lines.append(f"  n/a   {label}: not in this run")
    t["lines"] = lines
    return t
