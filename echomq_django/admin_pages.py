"""What the admin's job and queue pages show, read live from Redis (DESIGN §8).

Pure reads through the public API (``get_job``, ``get_flow``,
``dependencies``, ``counts``, ``deadletters``); values come back as plain
text for the templates to escape. Job links go through the admin's
``job/<queue>/<id>/`` lookup view, so a child on another queue links the
same way as one on this queue.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from django.urls import reverse

from .exceptions import EchoMQError, JobNotFound
from .keyspace import validate_id, validate_queue
from .mirror import ms_to_datetime

FLOW_DEPTH = 3  # levels of a parent's tree read and shown
FLOW_ROWS = 200  # tree rows shown; the rest are counted, not listed
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


def _ref_link(mq, ref: str) -> dict:
    queue, job_id = mq.keys.parse_ref(ref)
    return {"queue": queue, "id": job_id, "url": job_url(queue, job_id)}


def flow_rows(root: dict) -> tuple[list[dict], int]:
    """The tree under ``root`` (a ``get_flow`` answer) depth first, as rows
    ``{queue, id, url, depth, indent (px), state, policy, value, error,
    remaining}``, at most ``FLOW_ROWS``; returns ``(rows, nodes not shown)``."""
    rows, hidden = [], 0
    stack = [(child, 1) for child in reversed(root["children"])]
    while stack:
        node, depth = stack.pop()
        stack.extend((child, depth + 1) for child in reversed(node["children"]))
        if len(rows) >= FLOW_ROWS:
            hidden += 1
            continue
        rows.append(
            {
                "queue": node["queue"],
                "id": node["id"],
                "url": job_url(node["queue"], node["id"]),
                "depth": depth,
                "indent": 24 * (depth - 1),
                "state": node["state"],
                "policy": node["policy"],
                "remaining": node["remaining"],
                "value": _cell(as_text(node["result"], False))
                if node["result"] is not None
                else "",
                "error": _cell(node["error"]),
            }
        )
    return rows, hidden


def job_page(mq, queue: str, job_id: str) -> dict:
    """Context for a job's page: ``live`` (the ``Job``, or None when gone),
    ``live_error`` (text when Redis could not be read), ``payload`` /
    ``result`` / ``error`` (full text), ``parent_url``, and for a parent
    ``tree`` / ``tree_hidden`` / ``deps`` (lists of ``{queue, id, url,
    text}`` by how each child resolved) / ``remaining``."""
    ctx: dict[str, Any] = {"live": None, "live_error": "", "is_parent": False}
    try:
        job = mq.get_job(queue, job_id)
        flow = mq.get_flow(queue, job_id, depth=FLOW_DEPTH)
        deps = mq.dependencies(queue, job_id)
    except JobNotFound:
        return ctx
    except (redis.RedisError, EchoMQError) as err:
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
    if flow["children"]:
        rows, hidden = flow_rows(flow)

        def refs(mapping: dict, values: bool = False) -> list[dict]:
            return [
                {**_ref_link(mq, ref), "text": _cell(as_text(v, False) if values else v)}
                for ref, v in sorted(mapping.items())
            ]

        ctx.update(
            is_parent=True,
            tree=rows,
            tree_hidden=hidden,
            remaining=deps.remaining,
            processed=refs(deps.processed, values=True),
            failed=refs(deps.failed),
            ignored=refs(deps.ignored),
            removed=refs(deps.removed),
            unprocessed=[_ref_link(mq, ref) for ref in deps.unprocessed],
        )
    return ctx


def queue_page(mq, queue: str) -> dict:
    """Context for a queue's page: ``counts`` (live, ``EchoMQ.counts``) and
    ``deadletters`` (the first ``DEADLETTERS_SHOWN`` dead-lettered outbox
    entries: ``{kind, child, parent, value, reason, at}``), or ``live_error``."""
    try:
        counts = mq.counts(queue)
        letters = mq.deadletters(queue, 0, DEADLETTERS_SHOWN - 1)  # decodes what it can
    except (redis.RedisError, EchoMQError) as err:
        return {"live_error": str(err)}
    rows = []
    for d in letters:
        entry = d.get("entry") or {}
        child = parent = None
        try:
            child = _ref_link(mq, entry["c"])
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
                "raw": json.dumps(entry),
                "reason": d.get("reason", ""),
                "at": ms_to_datetime(d.get("at")),
            }
        )
    return {
        "counts": counts,
        "deadletters": rows,
        "deadletters_hidden": max(0, counts["deadletter"] - len(rows)),
    }
