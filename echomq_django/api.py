"""Module-level API over the ``EchoMQ`` built from settings (DESIGN §7).

``enqueue``, ``enqueue_many`` and ``add_flow`` take ``on_commit``:

* ``None`` (the default): inside an atomic block (``transaction.atomic``,
  ATOMIC_REQUESTS) the write waits for the commit, as django-rq does; outside
  one it happens now. So a view or a ``post_save`` receiver never starts work
  for a row that is rolled back.
* ``True``: always through the enqueue outbox (``outbox.py``, DESIGN §10.4):
  the job or flow is written to the ``OutboxEntry`` table in the current
  transaction of database ``using``, pushed to Redis right after the commit
  and the row deleted; when Redis is down then, the row waits for the worker
  or the pump to push it. Outside a transaction the row is written and
  pushed at once.
* ``False``: now, straight to Redis, even inside a transaction.

The ids are known before the commit: generated up front and returned at once
(and fixed in the outbox row, so a repeated push never runs anything twice).
Validation (names, ids, payloads, flow shape) happens now either way, so a bad
call raises in the caller, not later in the commit hook. ``aenqueue`` and
``aadd_flow`` are the same for async code.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, transaction

from . import commit_outbox as outbox
from .conf import get_mq
from .core import flows as _flows
from .core.flows import Flow, FlowRef
from .core.jobs import Dependencies, Job, Outcome
from .core.keyspace import validate_id, validate_queue
from .core.options import check_job_options
from .core.refs import JobRef, Page, RefDict, as_ref
from .core.retention import job_keep


def _defer(on_commit: bool | None, using: str | None) -> bool:
    if on_commit is False:
        return False
    if on_commit is True:
        return True
    return transaction.get_connection(using or DEFAULT_DB_ALIAS).in_atomic_block


def enqueue(
    queue: str,
    name: str,
    payload: Any = None,
    *,
    job_id: str | None = None,
    max_attempts: int | None = None,
    backoff_ms: int | None = None,
    delay_ms: int = 0,
    priority: int = 0,
    timeout_ms: int | None = None,
    dedup_key: str | None = None,
    dedup_ttl_ms: int | None = None,
    keep: int | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    **options: Any,
) -> str:
    """Add one job; returns its id (str). See ``EchoMQ.enqueue`` for the
    arguments (``priority``, ``timeout_ms``, ``dedup_key``, ``dedup_ttl_ms``:
    DESIGN §10.3; ``keep``: §10.2) and errors, and this module's docstring for ``on_commit`` /
    ``using`` (the database alias whose transaction is watched and that holds
    the outbox row). A deferred add raises the same validation errors now,
    and the database's error if the outbox table is missing; it returns the
    id it will use: a dedup hit is known only at the push."""
    mq = get_mq()
    kwargs = dict(
        job_id=job_id if job_id is not None else _flows.new_id(),
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        delay_ms=delay_ms,
        priority=priority,
        timeout_ms=timeout_ms,
        dedup_key=dedup_key,
        dedup_ttl_ms=dedup_ttl_ms,
        keep=keep,
    )
    if not _defer(on_commit, using):
        return mq.enqueue(queue, name, payload, **kwargs)
    validate_queue(queue)
    job_id = validate_id(kwargs.pop("job_id"))
    if not isinstance(name, str) or not name:
        raise ValueError(f"a job needs a name (the handler's), got {name!r}")
    check_job_options(priority, delay_ms, timeout_ms, dedup_key, dedup_ttl_ms)
    job_keep(keep)  # DESIGN §10.2: refused now, not at the push
    mq.encode(payload)
    outbox.write_job(queue, name, payload, job_id, kwargs, using=using, mq=mq)
    return job_id


def enqueue_many(
    queue: str, jobs, *, on_commit: bool | None = None, using: str | None = None
) -> list[str]:
    """Add many plain jobs to ``queue``; returns their ids in order. See
    ``EchoMQ.enqueue_many`` for ``jobs`` (``(name, payload)``, ``(name,
    payload, options)`` or dicts, with ``enqueue``'s options) and the errors,
    and this module's docstring for ``on_commit`` / ``using``. Now: one
    round trip, all or nothing. Deferred: every job is checked and its id
    fixed now, and each is an outbox row of its own (DESIGN §10.4: nothing
    lost when Redis is down at the commit), pushed after the commit one by
    one, as ``enqueue``'s are. DESIGN §10.1."""
    mq = get_mq()
    plan = mq.bulk.plan_many(queue, jobs)
    if not _defer(on_commit, using):
        return mq.bulk.land_many(plan)
    for name, payload, job_id, options in plan.jobs():
        outbox.write_job(queue, name, payload, job_id, options, using=using, mq=mq)
    return plan.ids


def _assign_ids(flow: Flow) -> None:
    stack, seen = [flow], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, Flow) or id(node) in seen:
            continue  # plan() reports these
        seen.add(id(node))
        if node.job_id is None:
            node.job_id = _flows.new_id()
        stack.extend(node.children)


def add_flow(flow: Flow, *, on_commit: bool | None = None, using: str | None = None) -> FlowRef:
    """Land a flow; returns its ``FlowRef`` (ids known even when deferred).
    See ``EchoMQ.add_flow`` for errors and this module for ``on_commit``."""
    mq = get_mq()
    if not _defer(on_commit, using):
        return mq.add_flow(flow)
    _assign_ids(flow)
    nodes = _flows.plan(flow, mq.encode)
    outbox.write_flow(flow, using=using, mq=mq)
    root = nodes[0]
    return FlowRef(
        queue=root.queue,
        parent_id=root.id,
        child_ids=[cid for _, cid in root.children],
        nodes=[JobRef._trusted(n.queue, n.id) for n in nodes],
    )


def add_flows(
    flows: list[Flow], *, on_commit: bool | None = None, using: str | None = None
) -> list[FlowRef]:
    """``add_flow`` for several flows in one round trip where possible."""
    if not _defer(on_commit, using):
        return get_mq().add_flows(flows)
    return [add_flow(f, on_commit=True, using=using) for f in flows]


async def aenqueue(queue: str, name: str, payload: Any = None, **kwargs: Any) -> str:
    """``enqueue`` for async code (an async view): runs it in the thread
    Django's async ORM uses (``sync_to_async(thread_sensitive=True)``), so
    ``on_commit`` sees the same transaction. Same arguments and errors."""
    return await sync_to_async(enqueue, thread_sensitive=True)(queue, name, payload, **kwargs)


async def aadd_flow(flow: Flow, **kwargs: Any) -> FlowRef:
    """``add_flow`` for async code, as ``aenqueue`` is for ``enqueue``."""
    return await sync_to_async(add_flow, thread_sensitive=True)(flow, **kwargs)


def get_job(queue: str, job_id: str) -> Job:
    """``EchoMQ.get_job`` on the settings' connection."""
    return get_mq().get_job(queue, job_id)


def retry(queue: str, job_id: str) -> Outcome:
    """``EchoMQ.retry`` (retry-by-id of a dead job) on the settings' connection."""
    return get_mq().retry(queue, job_id)


def children_values(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> RefDict | Page[RefDict]:
    """``EchoMQ.children_values`` on the settings' connection: ``{JobRef:
    result}``, or one ``Page`` with ``count`` (docs/use.md#paged-reads)."""
    return get_mq().children_values(queue, job_id, cursor, count)


def dependencies(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> Dependencies | Page[Dependencies]:
    """``EchoMQ.dependencies`` on the settings' connection, or one ``Page``
    of it with ``count`` (docs/use.md#paged-reads)."""
    return get_mq().dependencies(queue, job_id, cursor, count)


def dependency_counts(queue: str, job_id: str) -> dict:
    """``EchoMQ.dependency_counts`` on the settings' connection."""
    return get_mq().dependency_counts(queue, job_id)


def ignored_failures(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> RefDict | Page[RefDict]:
    """``EchoMQ.ignored_failures`` on the settings' connection: ``{JobRef:
    error}``, or one ``Page`` with ``count`` (docs/use.md#paged-reads)."""
    return get_mq().ignored_failures(queue, job_id, cursor, count)


def get_flow(queue: str, job_id: str, depth: int | None = None) -> dict:
    """``EchoMQ.get_flow`` on the settings' connection."""
    return get_mq().get_flow(queue, job_id, depth)


def pause(queue: str) -> bool:
    """``EchoMQ.pause`` on the settings' connection (DESIGN §10.3)."""
    return get_mq().pause(queue)


def resume(queue: str) -> bool:
    """``EchoMQ.resume`` on the settings' connection (DESIGN §10.3)."""
    return get_mq().resume(queue)


def is_paused(queue: str) -> bool:
    """``EchoMQ.is_paused`` on the settings' connection (DESIGN §10.3)."""
    return get_mq().is_paused(queue)


def remove_child_dependency(queue: str, parent_id: str, child: JobRef | tuple[str, str] | str):
    """``EchoMQ.remove_child_dependency`` on the settings' connection
    (docs/scheduling.md): ``child`` a ``JobRef`` or ``(queue, id)``; a raw
    key is deprecated (docs/use.md#deprecated-raw-keys)."""
    mq = get_mq()
    return mq.remove_child_dependency(queue, parent_id, as_ref(child, mq.keys, 3))


def remove_unprocessed_children(queue: str, parent_id: str):
    """``EchoMQ.remove_unprocessed_children`` on the settings' connection
    (DESIGN §10.3)."""
    return get_mq().remove_unprocessed_children(queue, parent_id)


def remove(queue: str, job_id: str):
    """``EchoMQ.remove`` on the settings' connection (DESIGN §10.2): remove a
    job that is not active, with its subtree. Raises ``JobNotFound``,
    ``JobNotRemovable``."""
    return get_mq().remove(queue, job_id)


def cancel(queue: str, job_id: str):
    """``EchoMQ.cancel`` on the settings' connection (DESIGN §10.2): cancel a
    job and its unfinished subtree (an active job is marked). Raises
    ``JobNotFound``, ``JobNotCancellable``."""
    return get_mq().cancel(queue, job_id)
