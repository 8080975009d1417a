"""What adds jobs and flows over the ``EchoMQ`` built from settings, and
when (docs/explanation/house.md, "api/").

``enqueue``, ``enqueue_many`` and ``add_flow`` take ``on_commit``:

* ``None`` (the default): inside an atomic block (``transaction.atomic``, ATOMIC_REQUESTS)
  the write waits for the commit, as django-rq does; outside one it happens now. So a
  view or a ``post_save`` receiver never starts work for a row that is rolled back.
* ``True``: always through the commit outbox (``commit_outbox.py``,
  docs/explanation/protocol.md#the-commit-outbox): the job or flow is written to the
  ``OutboxEntry`` table in the current transaction of database ``using``, pushed to Redis
  right after the commit and the row deleted; when Redis is down then, the row waits for
  the worker or the pump to push it. Outside a transaction it is written and pushed at once.
* ``False``: now, straight to Redis, even inside a transaction.

``ECHOMQ["ENQUEUE_WHEN_DOWN"] = "outbox"`` (default ``"raise"``): an add that goes
straight to Redis because no transaction is open (``on_commit`` None outside an atomic
block) and finds Redis away writes the same outbox row instead of raising
``RedisUnavailable``, and returns the ids as usual; the worker and the pump push it once
Redis answers
(docs/howto/durable-enqueue.md#outside-a-transaction-too-enqueue_when_down). An explicit
``on_commit=False`` still raises.

The ids are known before the commit: generated up front and returned at once
(and fixed in the outbox row, so a repeated push never runs anything twice).
Validation (names, ids, payloads, flow shape) happens now either way, so a bad call raises in the
caller, not later in the commit hook. ``aenqueue`` and ``aadd_flow`` are the same for async code.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, transaction

from .. import commit_outbox as outbox
from ..conf import enqueue_when_down, get_mq, offline_mq
from ..core import flows as _flows
from ..core.exceptions import EchoMQError, RedisUnavailable
from ..core.flows import Flow, FlowRef
from ..core.keyspace import validate_id, validate_name, validate_queue
from ..core.options import check_attempts, check_group, check_job_options
from ..core.refs import ref_list
from ..core.retention import job_keep
from ..core.retry import policy_keywords
from ..protocol.flows import check_flow_list


def _defer(on_commit: bool | None, using: str | None) -> bool:
    if on_commit is False:
        return False
    if on_commit is True:
        return True
    return transaction.get_connection(using or DEFAULT_DB_ALIAS).in_atomic_block


log = logging.getLogger("echomq_django.api")

UNSERVED_EVERY_S = 60.0  # a queue no setting names is looked up at most this often per process
UNSERVED_MAX = 10_000  # queues the look-up times are kept for (then forgotten at once)
_unserved_lock = threading.Lock()
_unserved_at: dict[str, float] = {}  # queue -> monotonic time it was looked up
_unserved_warned: set[str] = set()


def _warn_if_unserved(mq, queue: str) -> None:
    """Log one WARNING per process per queue when a job is added to a queue
    that ``ECHOMQ["QUEUES"]`` does not name and no live worker serves: a
    typo ("defualt") would wait forever, silently
    (docs/howto/operate.md#echomq_stats). A queue the settings name costs a
    dict lookup; another one read (the live processes) at most once per
    ``UNSERVED_EVERY_S`` until it warned. Never raises."""
    if queue in mq.queues or queue in _unserved_warned:
        return
    now = time.monotonic()
    with _unserved_lock:
        if now - _unserved_at.get(queue, -UNSERVED_EVERY_S) < UNSERVED_EVERY_S:
            return
        if len(_unserved_at) >= UNSERVED_MAX:
            _unserved_at.clear()
        _unserved_at[queue] = now
    try:
        procs = mq.presence.live_processes()
    except EchoMQError:
        return  # the add itself reports an outage
    if any(p.kind == "worker" and queue in p.queues for p in procs):
        return
    with _unserved_lock:
        if queue in _unserved_warned or len(_unserved_warned) >= UNSERVED_MAX:
            return
        _unserved_warned.add(queue)
    served = sorted({q for p in procs if p.kind == "worker" for q in p.queues})
    log.warning(
        "job added to queue %r, which ECHOMQ['QUEUES'] does not name and no live worker "
        "serves: it waits until a worker runs on %r. A typo? Queues in the settings: %s; "
        "served by live workers: %s",
        queue,
        queue,
        ", ".join(sorted(mq.queues)[:50]) or "(none)",
        ", ".join(served[:50]) or "(none)",
    )


def _warn_after_commit(mq, queues, using: str | None) -> None:
    """``_warn_if_unserved`` for a deferred add, after the commit (when the
    push has been tried), unless each queue is known to need no look-up."""
    due = [q for q in queues if q not in mq.queues and q not in _unserved_warned]
    if due and not getattr(mq, "offline", False):
        transaction.on_commit(
            lambda: [_warn_if_unserved(mq, q) for q in due], using=using, robust=True
        )


def _producer_mq():
    """``(get_mq(), None)``; while it cannot be built (a Cluster none of
    whose startup nodes answers) ``(offline_mq(), the RedisUnavailable)``:
    a deferred add still checks, encodes and writes its outbox row, and
    pushes it with ``get_mq()`` once that can be built."""
    try:
        return get_mq(), None
    except RedisUnavailable as err:
        return offline_mq(), err


def _now(mq, down: RedisUnavailable | None):
    """``mq`` to send with now; raises ``down`` when there is none."""
    if down is not None:
        raise down
    return mq


def _outbox_when_down(on_commit: bool | None, err: RedisUnavailable) -> bool:
    """True when an add that went straight to Redis and met ``err`` is to be
    written to the commit outbox instead (``ENQUEUE_WHEN_DOWN =
    "outbox"``, and ``on_commit`` not an explicit False)."""
    return on_commit is not False and enqueue_when_down() == "outbox"


def _written_when_down(err: RedisUnavailable, what: str) -> None:
    outbox.log.warning(
        "%s; %s written to the commit outbox (ENQUEUE_WHEN_DOWN='outbox')", err, what
    )


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
    group: str | None = None,
    depends_on: list | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    **options: Any,
) -> str:
    """Add one job; returns its id (str). See ``EchoMQ.enqueue`` for the arguments (``priority``,
    ``timeout_ms``, ``dedup_key``, ``dedup_ttl_ms``: docs/explanation/protocol.md#scheduling;
    ``keep``: docs/explanation/lifecycle.md; ``group``: docs/explanation/protocol.md#groups;
    ``options``: ``expires_ms`` and the retry policy,
    docs/howto/retries.md) and errors, and this module's docstring for ``on_commit`` / ``using``
    (the database alias whose transaction is watched and that holds the outbox row). A deferred
    add raises the same validation errors now, and the database's error if the outbox table is
    missing; it returns the id it will use: a dedup hit is known only at the push.
    ``depends_on``: jobs already added it waits for, a list of job refs or
    one (docs/howto/canvas.md#depends-on-existing-jobs)."""
    mq, down = _producer_mq()
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
        group=group,
        **policy_keywords(options),  # checked now: docs/howto/retries.md
    )
    if depends_on:  # a flow of one node and its dependencies
        flow = Flow(queue, name, payload, depends_on=list(ref_list(depends_on)), **kwargs)
        return add_flow(flow, on_commit=on_commit, using=using).parent_id
    if not _defer(on_commit, using):
        try:
            job_id = _now(mq, down).enqueue(queue, name, payload, **kwargs)
            _warn_if_unserved(mq, queue)
            return job_id
        except RedisUnavailable as err:
            if not _outbox_when_down(on_commit, err):
                raise
            job_id = _write_job(mq, queue, name, payload, kwargs, using, push=False)
            _written_when_down(err, f"job {queue}/{job_id}")
            return job_id
    job_id = _write_job(mq, queue, name, payload, kwargs, using)
    _warn_after_commit(mq, [queue], using)
    return job_id


def _write_job(mq, queue, name, payload, kwargs: dict, using, push: bool = True) -> str:
    """Check one job as ``EchoMQ.enqueue`` would, then write its outbox row
    (``push``: pushed after the commit; else left for the drainers)."""
    kwargs = dict(kwargs)
    priority, delay_ms, timeout_ms = kwargs["priority"], kwargs["delay_ms"], kwargs["timeout_ms"]
    dedup_key, dedup_ttl_ms, keep = kwargs["dedup_key"], kwargs["dedup_ttl_ms"], kwargs["keep"]
    validate_queue(queue)
    job_id = validate_id(kwargs.pop("job_id"))
    validate_name(name)
    check_attempts(kwargs["max_attempts"], kwargs["backoff_ms"])  # refused now, not at the push
    check_job_options(priority, delay_ms, timeout_ms, dedup_key, dedup_ttl_ms)
    job_keep(keep)  # docs/explanation/lifecycle.md: refused now, not at the push
    check_group(kwargs["group"])  # docs/explanation/protocol.md#groups
    mq.encode(payload)
    outbox.write_job(queue, name, payload, job_id, kwargs, using=using, mq=mq, push=push)
    return job_id


def enqueue_many(
    queue: str, jobs, *, on_commit: bool | None = None, using: str | None = None
) -> list[str]:
    """Add many plain jobs to ``queue``; returns their ids in order. See
    ``EchoMQ.enqueue_many`` for ``jobs`` (``(name, payload)``, ``(name,
    payload, options)`` or dicts, with ``enqueue``'s options) and the errors,
    and this module's docstring for ``on_commit`` / ``using``. Now: one
    round trip, all or nothing. Deferred: every job is checked and its id
    fixed now, and each is an outbox row of its own
    (docs/explanation/protocol.md#the-commit-outbox: nothing
    lost when Redis is down at the commit), pushed after the commit one by
    one, as ``enqueue``'s are. docs/explanation/no-polling.md#bulk-enqueue."""
    mq, down = _producer_mq()
    plan = mq.bulk.plan_many(queue, jobs)
    if not _defer(on_commit, using):
        try:
            ids = _now(mq, down).bulk.land_many(plan)
            _warn_if_unserved(mq, queue)
            return ids
        except RedisUnavailable as err:
            if not _outbox_when_down(on_commit, err):
                raise
            # some may have landed: their rows count as pushed at the drain
            for name, payload, job_id, options in plan.jobs():
                outbox.write_job(
                    queue, name, payload, job_id, options, using=using, mq=mq, push=False
                )
            _written_when_down(err, f"{len(plan.ids)} jobs of {queue}")
            return plan.ids
    for name, payload, job_id, options in plan.jobs():
        outbox.write_job(queue, name, payload, job_id, options, using=using, mq=mq)
    _warn_after_commit(mq, [queue], using)
    return plan.ids


def add_flow(flow: Flow, *, on_commit: bool | None = None, using: str | None = None) -> FlowRef:
    """Land a flow; returns its ``FlowRef`` (ids known even when deferred).
    See ``EchoMQ.add_flow`` for errors and this module for ``on_commit``."""
    mq, down = _producer_mq()
    if not _defer(on_commit, using):
        if on_commit is None and enqueue_when_down() == "outbox":
            _flows.assign_ids(flow)  # fixed now: a flow half landed then lands whole from its row
        try:
            ref = _now(mq, down).add_flow(flow)
            for q in dict.fromkeys(q for q, _ in ref.nodes):
                _warn_if_unserved(mq, q)
            return ref
        except RedisUnavailable as err:
            if not _outbox_when_down(on_commit, err):
                raise
            ref = _write_flow(mq, flow, using, push=False)
            _written_when_down(err, f"flow {ref.queue}/{ref.parent_id}")
            return ref
    ref = _write_flow(mq, flow, using)
    _warn_after_commit(mq, dict.fromkeys(q for q, _ in ref.nodes), using)
    return ref


def _checked(mq, flow: Flow):
    """A flow checked as ``EchoMQ.add_flow`` would, its ids assigned now: its plan."""
    _flows.assign_ids(flow)
    return _flows.plan(flow, mq.encode)


def _write_flow(mq, flow: Flow, using, push: bool = True, plan=None) -> FlowRef:
    """Check a flow (``_checked``; ``plan``: checked already), then write its
    outbox row (``push``: pushed after the commit; else left for the
    drainers); returns its ``FlowRef``."""
    plan = plan or _checked(mq, flow)
    outbox.write_flow(flow, using=using, mq=mq, push=push)
    queue, root_id, children = plan.root
    return FlowRef(
        queue=queue,
        parent_id=root_id,
        child_ids=[cid for _, cid in children],
        nodes=plan.refs(),
    )


def add_flows(
    flows: list[Flow], *, on_commit: bool | None = None, using: str | None = None
) -> list[FlowRef]:
    """``add_flow`` for several flows in one round trip where possible
    (``ENQUEUE_WHEN_DOWN = "outbox"``: Redis away, each flow is written to
    the outbox as ``add_flow`` does). Deferred too, every flow is checked
    before the first is written: a bad one raises and none is added."""
    check_flow_list(flows)
    if not _defer(on_commit, using):
        when_down = on_commit is None and enqueue_when_down() == "outbox"
        if when_down:
            for f in flows:
                _flows.assign_ids(f)
        mq, down = _producer_mq()
        try:
            return _now(mq, down).add_flows(flows)
        except RedisUnavailable as err:
            if not _outbox_when_down(on_commit, err):
                raise
            refs = [_write_flow(mq, f, using, push=False) for f in flows]
            _written_when_down(err, f"{len(refs)} flows")
            return refs
    mq, _ = _producer_mq()
    plans = [_checked(mq, f) for f in flows]  # all or nothing: checked before the first row
    refs = [_write_flow(mq, f, using, plan=p) for f, p in zip(flows, plans, strict=True)]
    _warn_after_commit(mq, dict.fromkeys(q for ref in refs for q, _ in ref.nodes), using)
    return refs


async def aenqueue(queue: str, name: str, payload: Any = None, **kwargs: Any) -> str:
    """``enqueue`` for async code (an async view): runs it in the thread
    Django's async ORM uses (``sync_to_async(thread_sensitive=True)``), so
    ``on_commit`` sees the same transaction. Same arguments and errors."""
    return await sync_to_async(enqueue, thread_sensitive=True)(queue, name, payload, **kwargs)


async def aadd_flow(flow: Flow, **kwargs: Any) -> FlowRef:
    """``add_flow`` for async code, as ``aenqueue`` is for ``enqueue``."""
    return await sync_to_async(add_flow, thread_sensitive=True)(flow, **kwargs)
