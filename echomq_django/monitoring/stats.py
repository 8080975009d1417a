"""What an operator asks of the queues, read from Redis (docs/explanation/house.md#monitoring).

``collect(mq, queues)`` answers, per queue, the counts by state, the oldest
pending job's age, throughput over the last minute, the outbox depth, the
dead-lettered outbox entries and whether it is paused, plus the live workers
and pumps; ``./manage.py echomq_stats`` prints it (a table, or ``--json``)
and the metrics collector exports the same numbers. Read-only.

The ``--json`` document is stable: ``SCHEMA`` names its version and
docs/reference/stats.md documents every field. A field may be added in a later version of
the same schema name; none is renamed, removed or retyped without a new one.
"""

from __future__ import annotations

from ..core.exceptions import EchoMQError
from ..core.jobs import JobState
from ..core.keyspace import validate_queue
from ..runners.heartbeat import known_queues, settings_queues
from ..runners.periodic import settings_state

SCHEMA = "echomq.stats/1"
WINDOW_MS = 60_000  # throughput is counted over the last minute
STATES = tuple(s.value for s in JobState)
GROUP_ROWS = 20  # groups the text table shows (--json has them all)


class UnknownQueue(EchoMQError, ValueError):
    """A queue name that no job, setting or live process has used."""


def queue_stats(mq, queue: str, now_ms: int | None = None) -> dict:
    """One queue's entry of ``collect``'s ``queues`` (docs/reference/stats.md#queues):
    ``counts`` (per state), ``oldest_pending_age_s`` (s or None),
    ``completed_last_minute``, ``dead_last_minute``, ``jobs_per_s`` (both over
    the last ``WINDOW_MS``, per second), ``outbox``, ``deadletter``,
    ``paused``, and the durable signals' backlog
    (docs/explanation/protocol.md#durable-signal-events): ``signals``
    (events not dispatched yet), ``signals_oldest_age_s`` (s or None),
    ``signals_deadletter``; ``groups`` (docs/reference/stats.md#groups): per
    group with work or paused, ``{pending, active, paused, concurrency}``
    (``{}`` for a queue without groups). Raises ``ValueError`` for a bad name,
    ``RedisUnavailable``."""
    now = mq.clock() if now_ms is None else now_ms
    return entries(mq, [queue], now)[1][queue]


def entries(
    mq, queues, now_ms: int, minutes: int | None = None, per: int = 1
) -> tuple[int | None, dict]:
    """``queue_stats`` of each of ``queues`` (names) at ``now_ms`` (ms) from
    one bulk read (``mq.probes.overview``: a fixed number of round trips
    whatever their number), with the per-minute rows as ``minutes`` when
    ``minutes`` is given (``per`` minutes a row): ``(now_minute or None,
    {queue: entry})``."""
    now_minute, rows = mq.probes.overview(queues, now_ms, WINDOW_MS, minutes, per=per)
    groups = mq.groups.counts_many(rows)
    out = {}
    for name, row in rows.items():
        counts, (done, dead), backlog = row["counts"], row["finished"], row["signals"]
        since, oldest = row["head_since"], backlog["oldest_ms"]
        out[name] = {
            "counts": {state: int(counts[state]) for state in STATES},
            "oldest_pending_age_s": None
            if since is None
            else round(max(0.0, (now_ms - since) / 1000), 3),
            "completed_last_minute": done,
            "dead_last_minute": dead,
            "jobs_per_s": round((done + dead) / (WINDOW_MS / 1000), 3),
            "outbox": int(counts["outbox"]),
            "deadletter": int(counts["deadletter"]),
            "paused": row["paused"],
            "signals": backlog["pending"],
            "signals_oldest_age_s": None if oldest is None else round(oldest / 1000, 3),
            "signals_deadletter": backlog["deadlettered"],
            "groups": groups[name],
        }
        if minutes is not None:
            out[name]["minutes"] = row["minutes"]
    return now_minute, out


def no_worker_for_s(queue: str, procs, since: dict[str, int | None], now_ms: int) -> float | None:
    """Seconds ``queue`` has had no live worker (docs/howto/operate.md#echomq_stats):
    None while one of ``procs`` (``ProcessInfo``) serves it, or when it is
    not known since when (``since``: ``presence.no_worker_since``); else
    counted from the last heartbeat of a worker on it, or from its first
    use when none ever served it."""
    if any(p.kind == "worker" and queue in p.queues for p in procs):
        return None
    at = since.get(queue)
    return None if at is None else round(max(0.0, (now_ms - at) / 1000), 3)


def resolve_queues(mq, asked=(), known: list[str] | None = None) -> list[str]:
    """The queues to report: ``asked`` (each must be known, else
    ``UnknownQueue`` naming it and the known ones; ``ValueError`` for a bad
    name), or every known queue when ``asked`` is empty. ``known``: the
    known queues (None: ``known_queues``; the mirror adds those it mirrors)."""
    known = known_queues(mq) if known is None else known
    if not asked:
        return known
    names = [validate_queue(q) for q in dict.fromkeys(asked)]
    unknown = [q for q in names if q not in known]
    if unknown:
        raise UnknownQueue(
            f"unknown queue{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: "
            f"no job, setting or live process uses {'them' if len(unknown) > 1 else 'it'}; "
            f"known queues: {', '.join(known) or '(none)'}"
        )
    return names


def collect(
    mq, queues=(), now_ms: int | None = None, minutes: int | None = None, per: int = 1
) -> dict:
    """The stats document (``SCHEMA``): ``{schema, at (ms), prefix, queues:
    {name: queue_stats + in_settings, workers, no_worker_for_s}, processes: [ProcessInfo
    dicts]}``. ``queues`` empty: every known queue. With ``minutes`` (the
    dashboard's chart), each queue also holds its per-minute rows
    (``minutes``, as ``mq.probes.minute_counts`` with ``per`` minutes a
    row) and the document ``now_minute``, from the same bulk read. Raises ``UnknownQueue``,
    ``ValueError``, ``RedisUnavailable``."""
    now = mq.clock() if now_ms is None else now_ms
    procs = mq.presence.live_processes(now)
    names = resolve_queues(mq, queues)
    configured = set(settings_queues())
    since = mq.presence.no_worker_since(names)
    now_minute, out = entries(mq, names, now, minutes, per)
    for name, entry in out.items():
        entry["in_settings"] = name in configured
        entry["workers"] = sum(1 for p in procs if p.kind == "worker" and name in p.queues)
        entry["no_worker_for_s"] = no_worker_for_s(name, procs, since, now)
    doc = {
        "schema": SCHEMA,
        "at": now,
        "prefix": mq.keys.prefix,
        "queues": out,
        "processes": [p.as_dict() for p in procs],
        "schedule": settings_state(mq),
    }
    if minutes is not None:
        doc["now_minute"] = now_minute
    return doc


# -- the table ----------------------------------------------------------------
def duration(seconds: float | None) -> str:
    """``4.2 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, s = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s} s"
    hours, m = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {m} min"
    days, h = divmod(hours, 24)
    return f"{days} d {h} h"


QUEUE_COLUMNS = (
    ("queue", None),
    ("pending", lambda q: q["counts"]["pending"]),
    ("active", lambda q: q["counts"]["active"]),
    ("delayed", lambda q: q["counts"]["delayed"]),
    ("awaiting", lambda q: q["counts"]["awaiting_children"]),
    ("completed", lambda q: q["counts"]["completed"]),
    ("dead", lambda q: q["counts"]["dead"]),
    ("oldest pending", lambda q: duration(q["oldest_pending_age_s"])),
    ("jobs/s (1 min)", lambda q: f"{q['jobs_per_s']:.2f}"),
    ("outbox", lambda q: q["outbox"]),
    ("dead-letters", lambda q: q["deadletter"]),
    ("signals", lambda q: q["signals"]),
    ("paused", lambda q: "yes" if q["paused"] else "no"),
    ("workers", lambda q: q["workers"]),
    ("no worker for", lambda q: duration(q.get("no_worker_for_s"))),
)


def _ago(now: int, at: int | None) -> str:
    return "-" if at is None else duration(max(0, now - at) / 1000) + " ago"


def _table(header: list[str], rows: list[list]) -> list[str]:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        first = r[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
    return lines


def render(doc: dict) -> str:
    """The stats document as the text ``echomq_stats`` prints."""
    now = doc["at"]
    lines = []
    if doc["queues"]:
        rows = [
            [name, *[get(q) for _, get in QUEUE_COLUMNS[1:]]] for name, q in doc["queues"].items()
        ]
        lines += _table([c for c, _ in QUEUE_COLUMNS], rows)
    else:
        lines.append("no queues known yet (no job added, none in ECHOMQ['QUEUES'])")
    groups = [(q, g, c) for q, s in doc["queues"].items() for g, c in s.get("groups", {}).items()]
    if groups:  # docs/explanation/protocol.md#groups: the busiest GROUP_ROWS
        groups.sort(key=lambda row: (-row[2]["pending"], row[0], row[1]))
        lines += [
            "",
            f"groups: {len(groups)}"
            + (f" (the {GROUP_ROWS} busiest)" * (len(groups) > GROUP_ROWS)),
        ]
        rows = [
            [
                q,
                g,
                c["pending"],
                c["active"],
                "yes" if c["paused"] else "no",
                c["concurrency"] or "-",
            ]
            for q, g, c in groups[:GROUP_ROWS]
        ]
        lines += _table(["queue", "group", "pending", "active", "paused", "cap"], rows)
    if doc.get("schedule"):
        lines += ["", f"periodic jobs: {len(doc['schedule'])}"]
        rows = [
            [e["entry"], e["queue"], e["name"], e["schedule"], _ago(now, e["last_tick"]),
             duration(max(0, e["next_tick"] - now) / 1000)]
            for e in doc["schedule"]
        ]  # fmt: skip
        lines += _table(["entry", "queue", "job", "schedule", "last tick", "next in"], rows)
    procs = doc["processes"]
    lines += ["", f"live workers and pumps: {len(procs)}"]
    if procs:
        rows = [
            [
                p["kind"],
                p["host"],
                p["pid"],
                ",".join(p["queues"]),
                duration((now - p["started_at"]) / 1000),
                p["jobs_done"],
                p["running"],
                duration((now - p["heartbeat_at"]) / 1000) + " ago",
                p["version"],
            ]
            for p in procs
        ]
        header = ["kind", "host", "pid", "queues", "up", "jobs done", "running", "last beat"]
        lines += _table([*header, "version"], rows)
    return "\n".join(lines)
