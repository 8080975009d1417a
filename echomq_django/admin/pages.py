"""What the admin's job and queue pages show, read live from Redis (DESIGN §8).

Pure reads through the public API (``get_job``, ``flow_page``,
``dependencies``, ``dependency_counts``, ``counts``, ``deadletters``,
``mq.presence.live_processes``); values come back as plain
text for the templates to escape. Job links go through the admin's
``job/<queue>/<id>/`` lookup view, so a child on another queue links the
same way as one on this queue.
"""

from __future__ import annotations

import json
from typing import Any

from django.urls import reverse

from ..core.exceptions import EchoMQError, JobNotFound
from ..core.keyspace import validate_id, validate_queue
from ..monitoring.mirror import ms_to_datetime
from ..protocol.outbox import OUTBOX_DEADLETTER_MAX
from .display import jobs_url

FLOW_DEPTH = 2  # levels under a parent shown on its page: children, grandchildren
CHILDREN_PER_PAGE = 100  # a parent's children per page of its tree
FANOUT = 20  # a child's own children shown under it (its page shows them all)
CELL_CHARS = 300  # a value or error in a tree or table cell; the child's own page has it all
DEADLETTERS_SHOWN = 100


def job_url(queue: str, job_id: str) -> str:
    """The admin page of job ``queue``/``job_id`` (through the lookup view)."""
    return reverse("admin:echomq_django_mirroredjob_lookup", args=[queue, job_id])


def as_text(value: Any, pretty: bool = True) -> str:
    """A decoded JSON value as JSON text for a ``<pre>`` (indented when
    ``pretty``), so ``"1"`` and ``1`` read differently."""
    return json.dumps(value, indent=2 if pretty else None, ensure_ascii=False)


def _cell(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + " …"


def _ref_link(ref) -> dict:
    """A ``JobRef`` (or ``(queue, id)``) as a link row ``{queue, id, url}``."""
    queue, job_id = ref
    return {"queue": queue, "id": job_id, "url": job_url(queue, job_id)}


def tree_nodes(node: dict) -> list[dict]:
    """The children of ``node`` (a ``flow_page`` answer) as the flow tree
    template's nodes ``{queue, id, url, state, policy, value, error,
    remaining, children, hidden}``; ``hidden`` counts children not read."""
    out = []
    for child in node["children"]:
        kids = tree_nodes(child)
        out.append(
            {
                "queue": child["queue"],
                "id": child["id"],
                "url": job_url(child["queue"], child["id"]),
                "state": child["state"],
                "policy": child["policy"],
                "remaining": child["remaining"],
                "value": _cell(as_text(child["result"], False))
                if child["result"] is not None
                else "",
                "error": child["error"] or "",  # whole: the tree folds it under its first line
                "children": kids,
                "hidden": child["total"] - len(kids),
            }
        )
    return out


def pager(page: int, total: int, per_page: int) -> dict:
    """``{page, pages, first, last, total, previous, next}`` (1-based item
    numbers; ``previous`` / ``next`` are page numbers or None)."""
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    first = (page - 1) * per_page
    return {
        "page": page,
        "pages": pages,
        "first": first + 1 if total else 0,
        "last": min(total, first + per_page),
        "total": total,
        "previous": page - 1 if page > 1 else None,
        "next": page + 1 if page < pages else None,
    }


def job_page(mq, queue: str, job_id: str, page: int = 1) -> dict:
    """Context for a job's page: ``live`` (the ``Job``, or None when gone),
    ``live_error`` (text when Redis could not be read), ``payload`` /
    ``result`` / ``error`` (full text), ``parent_url``, and for a parent
    ``tree`` (page ``page`` of its children, ``CHILDREN_PER_PAGE`` a page,
    each with up to ``FANOUT`` children of its own: ``tree_nodes``),
    ``pager``, ``deps`` (counts: ``dependency_counts``) and, among the
    children of that page, those that failed it / were ignored / removed /
    are unprocessed (lists of ``{queue, id, url, text}``: one paged
    ``dependencies`` read, docs/use.md#paged-reads). Reads stay bounded by
    the page, whatever the fan-in: a 10,000-child parent reads its counts
    and ``CHILDREN_PER_PAGE`` children."""
    ctx: dict[str, Any] = {"live": None, "live_error": "", "is_parent": False}
    try:
        job = mq.get_job(queue, job_id)
        counts = mq.dependency_counts(queue, job_id)
        book = pager(page, counts["children"], CHILDREN_PER_PAGE)
        start = (book["page"] - 1) * CHILDREN_PER_PAGE
        flow = mq.flow_page(queue, job_id, start, CHILDREN_PER_PAGE, FLOW_DEPTH, FANOUT)
        deps = (
            mq.dependencies(queue, job_id, start, CHILDREN_PER_PAGE).items
            if counts["children"]
            else None
        )
    except JobNotFound:
        return ctx
    except EchoMQError as err:
        ctx["live_error"] = str(err)
        return ctx
    ctx.update(
        live=job,
        payload=as_text(job.payload),
        result=as_text(job.result) if job.result is not None else "",
        error=job.error or "",
        lease_deadline=ms_to_datetime(job.lease_deadline),
        times={
            name: ms_to_datetime(getattr(job, name))
            for name in ("created_at", "started_at", "finished_at")
        },
        parent_url=job_url(job.parent_queue, job.parent) if job.parent else "",
    )
    if deps is not None:

        def refs(mapping: dict) -> list[dict]:
            return [{**_ref_link(ref), "text": text} for ref, text in mapping.items()]

        ctx.update(
            is_parent=True,
            tree=tree_nodes(flow),
            pager=book,
            deps=counts,
            remaining=deps.remaining,
            failed=refs(deps.failed),
            ignored=refs(deps.ignored),
            removed=refs(deps.removed),
            unprocessed=[_ref_link(ref) for ref in deps.unprocessed],
        )
    return ctx


def queue_page(mq, queue: str) -> dict:
    """Context for a queue's page: ``counts`` (live, ``EchoMQ.counts``),
    ``deadletters`` (the first ``DEADLETTERS_SHOWN`` dead-lettered outbox
    entries: ``{kind, child, parent, value, reason, at}``),
    ``deadletters_capped`` (the list is at its bound, ``OUTBOX_DEADLETTER_MAX``:
    older entries were dropped, so its count is what is kept), ``signals`` (the
    durable signals' backlog, ``EchoMQ.event_backlog``) and
    ``signal_deadletters`` (the newest ``DEADLETTERS_SHOWN`` events given up
    on: ``EchoMQ.deadlettered_events`` with ``job`` a link and ``at`` a
    datetime, DESIGN §10.6), or ``live_error``."""
    try:
        counts = mq.counts(queue)
        letters = mq.outbox.deadletters(queue, 0, DEADLETTERS_SHOWN - 1)  # decodes what it can
        signals = mq.signal_events.backlog(queue)
        lettered = mq.signal_events.deadlettered(queue, DEADLETTERS_SHOWN)
    except EchoMQError as err:
        return {"live_error": str(err)}
    signal_rows = [
        {
            **e,
            "job": {"queue": queue, "id": e["job_id"], "url": job_url(queue, e["job_id"])},
            "at": ms_to_datetime(e["at"]),
        }
        for e in lettered
    ]
    rows = []
    for d in letters:
        entry = d.get("entry")
        if isinstance(entry, dict):
            raw = json.dumps(entry)
        else:  # a poison entry (not a JSON object): its text as the pump read it
            raw, entry = (entry if isinstance(entry, str) else json.dumps(entry)), {}
        child = parent = None
        try:
            child = _ref_link(mq.keys.parse_ref(entry["c"]))
            validate_queue(entry["q"])  # both checked before a link is built
            validate_id(entry["p"])
            parent = {"queue": entry["q"], "id": entry["p"], "url": job_url(entry["q"], entry["p"])}
        except (KeyError, TypeError, ValueError):
            pass  # a malformed entry is shown as its raw text below
        rows.append(
            {
                "kind": entry.get("k", ""),
                "child": child,
                "parent": parent,
                "value": _cell(str(entry.get("v", ""))),
                "raw": raw,
                "reason": d.get("reason", ""),
                "at": ms_to_datetime(d.get("at")),
            }
        )
    capped = counts["deadletter"] >= OUTBOX_DEADLETTER_MAX
    return {
        "counts": counts,
        "deadletters": rows,
        "deadletters_hidden": max(0, counts["deadletter"] - len(rows)),
        "deadletters_capped": OUTBOX_DEADLETTER_MAX if capped else None,
        "signals": signals,
        "signal_deadletters": signal_rows,
        "signal_deadletters_hidden": max(0, signals["deadlettered"] - len(signal_rows)),
    }


def workers_page(mq) -> dict:
    """Context for the live workers page: ``now`` and ``processes`` (each a
    ``ProcessInfo`` dict plus ``up_s`` / ``beat_s`` seconds, ``queue_links``
    and ``running_links``, ``running_hidden``), or ``live_error``."""
    now = mq.clock()
    try:
        procs = mq.presence.live_processes(now)
    except EchoMQError as err:
        return {"live_error": str(err), "processes": [], "now": ms_to_datetime(now)}
    rows = []
    for p in procs:
        running = []
        for ref in p.running_jobs:
            queue, _, job_id = ref.partition("/")
            running.append({"queue": queue, "id": job_id, "url": job_url(queue, job_id)})
        rows.append(
            {
                **p.as_dict(),
                "up_s": max(0.0, (now - p.started_at) / 1000),
                "beat_s": max(0.0, (now - p.heartbeat_at) / 1000),
                "queue_links": [{"name": q, "url": jobs_url(q)} for q in p.queues],
                "running_links": running,
                "running_hidden": max(0, p.running - len(running)),
            }
        )
    return {"processes": rows, "now": ms_to_datetime(now)}
