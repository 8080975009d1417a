"""What the admin's job, queue and worker pages show
(docs/howto/operate.md#what-the-admins-pages-show): read live from Redis, and
when Redis cannot answer, the mirror's copy said to be one ("as of <time>
(mirror)"), never both side by side.

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
from ..models import TEXT_LIMIT, MirroredQueue
from ..monitoring.mirror import ms_to_datetime
from ..protocol.outbox import OUTBOX_DEADLETTER_MAX
from . import flow_graph
from .display import jobs_url

FLOW_DEPTH = 2  # levels under a parent shown on its page: children, grandchildren
CHILDREN_PER_PAGE = 100  # a parent's children per page of its tree
FANOUT = 20  # a child's own children shown under it (its page shows them all)
LOG_LINES = 100  # a job page shows its job log's newest lines, at most this many
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
    remaining, children, hidden, created_at, started_at, finished_at}``;
    ``hidden`` counts children not read; times in ms, or None."""
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
                # the counter is what an awaiting parent waits for; a dead
                # one's counter keeps its fp deaths (for a retry), not work
                "remaining": child["remaining"] if child["state"] == "awaiting_children" else None,
                "value": _cell(as_text(child["result"], False))
                if child["result"] is not None
                else "",
                "error": child["error"] or "",  # whole: the tree folds it under its first line
                "children": kids,
                "hidden": child["total"] - len(kids),
                **{t: child.get(t) for t in ("created_at", "started_at", "finished_at")},
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


def job_summary(job=None, row=None) -> dict:
    """The one summary a job page shows (docs/howto/operate.md#what-the-admins-pages-show):
    from ``job`` (the live ``Job``) when Redis answered, else from ``row``
    (its ``MirroredJob``). ``{live, as_of, state, attempts, created_at,
    started_at, finished_at, lease_deadline, parent, policy}``: ``as_of`` is
    when the mirror read the row (None when live), times are aware
    datetimes or None, ``attempts`` reads ``"1 of 3"``, ``parent`` is
    ``{queue, id, url}`` or None, ``policy`` a policy token."""
    src = job if job is not None else row
    if job is not None:
        times = {
            n: ms_to_datetime(getattr(job, n)) for n in ("created_at", "started_at", "finished_at")
        }
        parent_queue, parent_id = job.parent_queue, job.parent
        policy = str(job.parent_policy or "")
        lease = ms_to_datetime(job.lease_deadline) if job.state == "active" else None
    else:
        times = {n: getattr(row, n) for n in ("created_at", "started_at", "finished_at")}
        parent_queue, parent_id = row.parent_queue, row.parent_id
        policy = row.parent_policy or ("fp" if parent_id else "")
        lease = None
    parent = None
    if parent_id:
        parent = {"queue": parent_queue, "id": parent_id, "url": job_url(parent_queue, parent_id)}
    return {
        "live": job is not None,
        "as_of": None if job is not None else row.mirrored_at,
        "state": str(src.state),
        "attempts": f"{src.attempts} of {src.max_attempts}",
        **times,
        "lease_deadline": lease,
        "parent": parent,
        "policy": policy,
    }


def _pretty(stored: str) -> str:
    """A mirrored JSON value indented as the live one is; as stored when it
    does not parse (cut short by the mirror)."""
    try:
        return as_text(json.loads(stored)) if stored else ""
    except ValueError:
        return stored


def _mirror_view(row) -> dict:
    """What a job page shows of ``row`` (its ``MirroredJob``) when Redis
    cannot say: the summary as of the mirror, and its values as stored (cut
    to ``TEXT_LIMIT`` characters when ``trimmed``)."""
    return {
        "summary": job_summary(row=row),
        "progress": row.progress,
        "payload": _pretty(row.payload),
        "result": _pretty(row.result),
        "error": row.error,
        "trimmed": row.truncated,
        "text_limit": TEXT_LIMIT,
    }


CAN_FINISH = {"pending", "active", "delayed", "awaiting_children"}


def _unresolved(mq, queue: str, refs: list) -> tuple[list[dict], int, int]:
    """The children ``refs`` (``JobRef``s, one page) of a parent on ``queue``
    that have not resolved it yet: ``(shown, to_finish, undelivered)``.
    ``shown`` is each as ``{queue, id, url, state}`` (state read live, None
    for no such job); ``to_finish`` counts those that can still finish
    (``CAN_FINISH``), ``undelivered`` those that finished on another queue
    but whose word is still in that queue's outbox. One pipelined read per
    queue of the page's children."""
    by_queue: dict[str, list[str]] = {}
    for q, j in refs:
        by_queue.setdefault(q, []).append(j)
    states: dict[tuple[str, str], str | None] = {}
    for q, ids in by_queue.items():
        states.update({(q, j): st for j, st in mq.probes.states(q, ids).items()})
    to_finish = sum(1 for ref in refs if states[tuple(ref)] in CAN_FINISH)
    undelivered = sum(
        1 for ref in refs if ref[0] != queue and states[tuple(ref)] in ("completed", "dead")
    )
    shown = [{**_ref_link(ref), "state": states[tuple(ref)]} for ref in refs]
    return shown, to_finish, undelivered


def job_page(mq, row, page: int = 1) -> dict:
    """Context for the page of ``row`` (a ``MirroredJob``): ``summary`` (``job_summary``: live, or
    the mirror's when Redis could not be read or no longer holds the job), ``live`` (the
    ``Job``, or None), ``live_error`` (text when Redis could not be read), ``payload`` /
    ``result`` / ``error`` (full text when live; the mirror's, ``trimmed``, otherwise),
    ``progress`` (live, or the mirror's), ``logs`` (live only: the job log's newest
    ``LOG_LINES`` lines), ``parent_url``, and for a live parent ``tree`` (page ``page`` of its
    children, ``CHILDREN_PER_PAGE`` a page, each with up to ``FANOUT`` children of its own:
    ``tree_nodes``), ``pager``, ``deps`` (counts: ``dependency_counts``), and among the children
    of that page (one paged ``dependencies`` read, docs/howto/read-flows.md#paged-reads): those
    that failed it / were ignored / removed / are unresolved (lists of ``{queue, id, url,
    text}``; unresolved ones with their ``state``), ``to_finish`` (unresolved children that can
    still finish: pending, active, delayed or awaiting their own children; a dead parent's
    ``fp`` child is not one) and ``undelivered`` (children that finished on another queue but
    whose word has not reached the parent yet: the pump delivers it). Reads stay bounded by the
    page, whatever the fan-in: a 10,000-child parent reads its counts and ``CHILDREN_PER_PAGE``
    children. The pictures (``flow_graph``, docs/howto/operate.md#the-flow-graph):
    ``failing`` (the tree marks its failing path), ``state_bar`` and ``timeline``."""
    queue, job_id = row.queue, row.job_id
    ctx: dict[str, Any] = {"live": None, "live_error": "", "is_parent": False}
    try:
        job = mq.get_job(queue, job_id)
        logs = mq.job_logs(queue, job_id, -LOG_LINES, -1)
        counts = mq.dependency_counts(queue, job_id)
        book = pager(page, counts["children"], CHILDREN_PER_PAGE)
        start = (book["page"] - 1) * CHILDREN_PER_PAGE
        flow = mq.flow_page(queue, job_id, start, CHILDREN_PER_PAGE, FLOW_DEPTH, FANOUT)
        deps = (
            mq.dependencies(queue, job_id, start, CHILDREN_PER_PAGE).items
            if counts["children"]
            else None
        )
        unresolved = _unresolved(mq, queue, deps.unprocessed) if deps is not None else None
    except JobNotFound:
        return {**ctx, **_mirror_view(row)}
    except EchoMQError as err:
        return {**ctx, **_mirror_view(row), "live_error": str(err)}
    ctx.update(
        live=job,
        summary=job_summary(job=job),
        progress=job.progress,
        logs=logs,
        log_lines=LOG_LINES,
        payload=as_text(job.payload),
        result=as_text(job.result) if job.result is not None else "",
        error=job.error or "",
    )
    if deps is not None:

        def refs(mapping: dict) -> list[dict]:
            return [{**_ref_link(ref), "text": text} for ref, text in mapping.items()]

        tree = tree_nodes(flow)
        root = {**_ref_link((queue, job_id)), "state": flow["state"]}
        root.update({t: flow.get(t) for t in ("created_at", "started_at", "finished_at")})
        ctx.update(
            is_parent=True,
            tree=tree,
            failing=flow_graph.mark_failing(tree),
            state_bar=flow_graph.state_summary(counts),
            timeline=flow_graph.timeline(root, tree, mq.clock()),
            pager=book,
            deps=counts,
            to_finish=unresolved[1],
            undelivered=unresolved[2],
            failed=refs(deps.failed),
            ignored=refs(deps.ignored),
            removed=refs(deps.removed),
            unprocessed=unresolved[0],
        )
    return ctx


def _count_rows(counts: dict[str, int]) -> list[tuple[str, int]]:
    """``counts`` as ``(words, n)`` in the queue list's order and words."""
    words = {f: MirroredQueue._meta.get_field(f).verbose_name for f in MirroredQueue.COUNT_FIELDS}
    return [(words[f], counts[f]) for f in MirroredQueue.COUNT_FIELDS]


def queue_summary(mq, row) -> dict:
    """The counts a queue page shows once
    (docs/howto/operate.md#what-the-admins-pages-show): ``{live, as_of, counts,
    rows, oldest_pending_s, paused}`` read live (``counts`` as
    ``EchoMQ.counts``, ``rows`` them as ``(words, n)``, ``oldest_pending_s``
    the longest wait of its heads in seconds (``Probes.heads_since``) or
    None, ``paused`` a bool).
    Raises ``EchoMQError`` when Redis cannot be read; ``mirror_queue_summary``
    is the fallback."""
    counts = mq.counts(row.queue)
    since = mq.probes.heads_since([row.queue])[row.queue]
    return {
        "live": True,
        "as_of": None,
        "counts": counts,
        "rows": _count_rows(counts),
        "oldest_pending_s": None if since is None else max(0.0, (mq.clock() - since) / 1000),
        "paused": mq.is_paused(row.queue),
    }


def mirror_queue_summary(row) -> dict:
    """``queue_summary`` from ``row`` (a ``MirroredQueue``), as of its
    ``mirrored_at``; ``paused`` is None (the mirror does not keep it)."""
    return {
        "live": False,
        "as_of": row.mirrored_at,
        "counts": row.counts(),
        "rows": _count_rows(row.counts()),
        "oldest_pending_s": row.oldest_pending_age_s,
        "paused": None,
    }


def queue_page(mq, row) -> dict:
    """Context for the page of ``row`` (a ``MirroredQueue``): ``summary``
    (``queue_summary``, or ``mirror_queue_summary`` with ``live_error`` when
    Redis could not be read), ``counts`` (the summary's),
    ``deadletters`` (the first ``DEADLETTERS_SHOWN`` dead-lettered outbox
    entries: ``{kind, child, parent, value, reason, at}``),
    ``deadletters_capped`` (the list is at its bound, ``OUTBOX_DEADLETTER_MAX``:
    older entries were dropped, so its count is what is kept), ``signals`` (the
    durable signals' backlog, ``EchoMQ.event_backlog``) and
    ``signal_deadletters`` (the newest ``DEADLETTERS_SHOWN`` events given up
    on: ``EchoMQ.deadlettered_events`` with ``job`` a link and ``at`` a
    datetime, docs/explanation/signals.md), or ``live_error``."""
    queue = row.queue
    try:
        summary = queue_summary(mq, row)
        counts = summary["counts"]
        letters = mq.outbox.deadletters(queue, 0, DEADLETTERS_SHOWN - 1)  # decodes what it can
        signals = mq.signal_events.backlog(queue)
        lettered = mq.signal_events.deadlettered(queue, DEADLETTERS_SHOWN)
    except EchoMQError as err:
        summary = mirror_queue_summary(row)
        return {"live_error": str(err), "summary": summary, "counts": summary["counts"]}
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
        "summary": summary,
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
    and ``running_links``, ``running_hidden``), or only ``live_error`` (the
    page then says that alone: nothing on it was read)."""
    now = mq.clock()
    try:
        procs = mq.presence.live_processes(now)
    except EchoMQError as err:
        return {"live_error": str(err), "processes": []}
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
