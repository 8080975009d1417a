"""The commit outbox: durable ``on_commit`` adds (docs/explanation/protocol.md#the-commit-outbox).

``enqueue(..., on_commit=True)`` and ``add_flow(..., on_commit=True)`` (the
default inside an atomic block) call ``write_job`` / ``write_flow``: the job
or flow becomes one ``OutboxEntry`` row in the caller's transaction, with its
ids already fixed. A rollback leaves nothing anywhere. Right after the commit
``push_entry`` pushes it to Redis and deletes the row; when Redis is down
then, the row stays and ``drain`` (run by the worker and the pump) pushes
it later, oldest first.

Nothing runs twice:

* a push repeated after a crash between the push and the delete lands
  nothing new: a job whose id is already in Redis with the same name and
  payload counts as pushed (``enqueue`` refuses the id, and this module
  checks that it is the same job); a flow add is idempotent by its ids;
* two drainers never push one row both: each takes its rows under a row
  lock that skips rows another holds (``SELECT ... FOR UPDATE SKIP LOCKED``
  on PostgreSQL, MySQL 8 and Oracle); on SQLite the drainer takes the
  database's single write lock before it reads, so drainers go one at a time.

A row Redis refuses for good (its id taken by another job or flow, a payload
over the size limit) keeps its ``error`` and is skipped from then on, logged
at ERROR once: nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, router, transaction
from django.db.utils import DatabaseError

from .conf import get_mq
from .core.exceptions import DuplicateJob, EchoMQError, JobNotFound, RedisUnavailable
from .core.flows import Flow, FlowRef
from .core.jobs import Job
from .core.refs import ref_list
from .core.retry import exc_names

if TYPE_CHECKING:
    from .models import OutboxEntry

log = logging.getLogger("echomq_django.commit_outbox")

BATCH = 100  # rows one drain transaction pushes (and holds locks on)

__all__ = [
    "Drainer",
    "drain",
    "drain_after_sweep",
    "pending",
    "push_entry",
    "tables_missing",
    "waiting_job",
    "write_flow",
    "write_job",
]


def _model():
    # Looked up, not imported: ``import echomq_django`` must work before
    # Django's app registry is ready (settings modules, the test rigs).
    return apps.get_model("echomq_django", "OutboxEntry")


def _db(using: str | None) -> str:
    return using or router.db_for_write(_model()) or DEFAULT_DB_ALIAS


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _plain(mq, value: Any) -> Any:
    """``value`` as the JSON the queue will store (``mq.encode``: the
    project's ``JSON_ENCODER``, the size limit), decoded again: what a row
    holds is plain JSON, so pushing it later encodes to the same text."""
    return json.loads(mq.encode(value))


def flow_to_dict(flow: Flow, plain=None) -> dict:
    """A ``Flow`` tree as plain data: every field of each node (children
    nested), the ones at their default left out; ``plain`` maps each
    payload (default: unchanged)."""
    out = {}
    for f in dataclasses.fields(flow):
        value = getattr(flow, f.name)
        if f.name == "children":
            if value:
                out["children"] = [flow_to_dict(c, plain) for c in value]
        elif f.name == "depends_on":  # refs as [queue, id] pairs, kept only when set
            if value:
                refs = ref_list(value)
                out["depends_on"] = [list(r) if isinstance(r, tuple) else r for r in refs]
        elif f.name == "payload" and plain is not None:
            out["payload"] = plain(value)
        elif f.name in ("retry_on", "dont_retry_on") and value is not None:
            out[f.name] = list(exc_names(value, f.name))  # classes as their paths
        elif f.default is dataclasses.MISSING or value != f.default:
            out[f.name] = value
    return out


def flow_from_dict(data: dict) -> Flow:
    """The ``Flow`` tree ``flow_to_dict`` wrote."""
    known = {f.name for f in dataclasses.fields(Flow)}
    fields = {k: v for k, v in data.items() if k in known and k != "children"}
    return Flow(**fields, children=[flow_from_dict(c) for c in data.get("children", [])])


def write_job(
    queue: str,
    name: str,
    payload: Any,
    job_id: str,
    options: dict,
    using: str | None = None,
    mq=None,
    push: bool = True,
) -> OutboxEntry:
    """Write one job's row in the current transaction (of database
    ``using``) and, with ``push``, push it with ``mq`` (None: the settings'
    one) after the commit; without, the row waits for a drainer (Redis is
    known to be away: ``ENQUEUE_WHEN_DOWN = "outbox"``). ``options`` are
    ``EchoMQ.enqueue``'s keyword arguments but ``job_id``. Returns the row
    (saved). Raises ``PayloadError`` for a payload the queue refuses, and
    the database's error."""
    mq = _mq(mq)
    body = {"name": name, "payload": _plain(mq, payload), "options": options}
    return _write("job", queue, job_id, body, using, mq, push)


def write_flow(flow: Flow, using: str | None = None, mq=None, push: bool = True) -> OutboxEntry:
    """Write one flow's row (its ids all assigned) as ``write_job`` does."""
    mq = _mq(mq)
    body = flow_to_dict(flow, lambda value: _plain(mq, value))
    return _write("flow", flow.queue, flow.job_id, body, using, mq, push)


def _write(kind: str, queue: str, job_id: str, body: dict, using, mq, push) -> OutboxEntry:
    db = _db(using)
    entry = _model()(kind=kind, queue=queue, job_id=job_id, body=_dumps(body))
    entry.save(using=db)
    if getattr(mq, "offline", False):
        mq = None  # conf.offline_mq checks and encodes only: push with get_mq()
    if push:
        # robust: a push that fails in a way no one foresaw is logged by Django
        # and the other on_commit hooks still run; the row stays for a drainer
        transaction.on_commit(lambda: push_entry(entry.pk, mq, using=db), using=db, robust=True)
    return entry


def push(mq, entry: OutboxEntry) -> FlowRef | str:
    """Land one row's job or flow in Redis (not deleting the row). A job
    already there with the same name and payload counts as landed. Raises
    ``RedisUnavailable``, or the ``EchoMQError`` / ``ValueError`` Redis or
    validation gave for a row that can never land."""
    body = json.loads(entry.body)
    if entry.kind == "flow":
        return mq.add_flow(flow_from_dict(body))
    try:
        return mq.enqueue(
            entry.queue, body["name"], body["payload"], job_id=entry.job_id, **body["options"]
        )
    except DuplicateJob:
        try:
            there = mq.get_job(entry.queue, entry.job_id)
        except JobNotFound:
            raise DuplicateJob(f"job id {entry.job_id!r} was refused, then not found") from None
        if there.name == body["name"] and there.payload == body["payload"]:
            return entry.job_id  # pushed before; the row outlived a crash
        raise


def _lock_rows(db: str):
    """The undone rows, oldest first, locked for this transaction."""
    rows = _model().objects.using(db).filter(error="").order_by("id")
    features = connections[db].features
    if features.has_select_for_update_skip_locked:
        return rows.select_for_update(skip_locked=True)
    if features.has_select_for_update:
        return rows.select_for_update()
    if connections[db].vendor == "sqlite":
        # SQLite has one writer: take its write lock before reading, so a
        # second drainer waits here and then finds the rows gone.
        with connections[db].cursor() as cursor:
            cursor.execute(f"UPDATE {_model()._meta.db_table} SET tries = tries WHERE 0 = 1")
    return rows


def _refused(entry: OutboxEntry, err: Exception, db: str) -> None:
    entry.error = f"{type(err).__name__}: {err}"[:4000]
    entry.tries += 1
    entry.save(using=db, update_fields=["error", "tries"])
    log.error(
        "outbox entry %s (%s %s/%s) was refused and is kept, skipped from now on: %s",
        entry.pk,
        entry.kind,
        entry.queue,
        entry.job_id,
        entry.error,
    )


def _push_locked(mq, entries: list[OutboxEntry], db: str) -> tuple[int, RedisUnavailable | None]:
    """Push locked rows in order and delete the pushed ones, in the caller's
    transaction. Stops at a Redis outage (the row it hit counts a try) and
    returns it instead of raising, so the deletes still commit."""
    done: list[int] = []
    outage = None
    for entry in entries:
        try:
            push(mq, entry)
        except RedisUnavailable as err:
            _model().objects.using(db).filter(pk=entry.pk).update(tries=entry.tries + 1)
            outage = err
            break
        except (EchoMQError, ValueError, TypeError) as err:
            _refused(entry, err, db)
            continue
        done.append(entry.pk)
    if done:
        _model().objects.using(db).filter(pk__in=done).delete()
    return len(done), outage


def _mq(mq):
    return get_mq() if mq is None else mq


def push_entry(pk: int, mq=None, using: str | None = None) -> bool:
    """The after-commit push of one row: lock it (unless a drainer holds it),
    push, delete. True when it landed now. A Redis outage is logged at
    WARNING and leaves the row for ``drain``; it never raises into the
    committing caller."""
    db = _db(using)
    with transaction.atomic(using=db):
        entry = _lock_rows(db).filter(pk=pk).first()
        if entry is None:
            return False  # a drainer has it, or had it
        try:
            mq = _mq(mq)
        except RedisUnavailable as err:  # a Cluster no node of which answers yet
            pushed, outage = 0, err
        else:
            pushed, outage = _push_locked(mq, [entry], db)
    if outage is not None:
        log.warning(
            "%s; %s %s/%s stays in the commit outbox: the worker or the pump pushes it "
            "once Redis answers",
            outage,
            entry.kind,
            entry.queue,
            entry.job_id,
        )
    return pushed == 1


def drain(mq=None, using: str | None = None, limit: int | None = None) -> int:
    """Push the outbox's rows to Redis, oldest first, ``BATCH`` per
    transaction, until it is empty (or ``limit`` rows were pushed); returns
    how many landed. Rows another drainer holds are skipped. Raises
    ``RedisUnavailable`` (the rows pushed before it are deleted), and the
    database's error when the table is missing (see ``tables_missing``)."""
    mq, db, pushed = _mq(mq), _db(using), 0  # RedisUnavailable when it cannot be built
    while limit is None or pushed < limit:
        size = BATCH if limit is None else min(BATCH, limit - pushed)
        with transaction.atomic(using=db):
            entries = list(_lock_rows(db)[:size])
            n, outage = _push_locked(mq, entries, db) if entries else (0, None)
        pushed += n
        if outage is not None:
            raise outage
        if len(entries) < size:
            break
    return pushed


def waiting_job(job_id: str, queues, using: str | None = None) -> Job | None:
    """The job ``job_id`` (on one of ``queues``) as a pending ``Job`` while
    its row waits in the outbox (no timestamps: it is not in Redis yet), or
    None."""
    entry = (
        _model()
        .objects.using(_db(using))
        .filter(kind="job", job_id=job_id, queue__in=list(queues), error="")
        .first()
    )
    if entry is None:
        return None
    body = json.loads(entry.body)
    return Job(id=job_id, queue=entry.queue, name=body["name"], payload=body["payload"])


def pending(using: str | None = None) -> int:
    """How many rows wait to be pushed (refused rows not counted)."""
    return _model().objects.using(_db(using)).filter(error="").count()


def tables_missing(using: str | None = None) -> str:
    """``""`` when echomq_django's tables are in the database, else the
    one-line reason (``migrate`` not run) the commands log: a missing table
    would otherwise be a traceback per sweep."""
    db = _db(using)
    try:
        with connections[db].cursor() as cursor:
            names = set(connections[db].introspection.table_names(cursor))
    except DatabaseError as err:
        return f"database {db!r} cannot be read ({str(err).splitlines()[0]})"
    models = apps.get_app_config("echomq_django").get_models()
    tables = [m._meta.db_table for m in models if m._meta.managed]  # PeriodicEntry has none
    if all(t in names for t in tables):
        return ""
    return f"echomq_django's tables are missing from database {db!r}: run ./manage.py migrate"


def drain_after_sweep(pump, reports: dict) -> None:
    """The pump's after-sweep hook (``runpump`` installs it): drain the
    outbox into the pump's Redis. Raises ``RedisUnavailable`` (the pump
    waits the outage out); any other error is logged and the next sweep
    tries again."""
    try:
        if not connections[_db(None)].in_atomic_block:
            close_old_connections()  # a long-running pump outlives DB connections
        n = drain(pump.mq)
    except RedisUnavailable:
        raise
    except Exception:
        log.exception("draining the commit outbox failed; the next sweep tries again")
        return
    if n:
        log.info("pushed %d jobs or flows from the commit outbox", n)


class Drainer:
    """Drains the outbox on a daemon thread of its own: once at ``start()``,
    then every ``interval_s`` seconds until ``stop()`` (the worker runs one;
    the pump drains in its sweep instead). A Redis outage is left to the
    worker's own outage log (logged here at DEBUG) and tried again next
    interval; any other error (the database's) is logged at WARNING once per
    kind of error.
    ``pushed`` counts the rows it landed."""

    def __init__(self, mq, interval_s: float = 1.0, using: str | None = None) -> None:
        self.mq, self.interval_s, self.using = mq, float(interval_s), using
        self.pushed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._drain_now = True

    def start(self, drain_now: bool = True) -> None:
        """Start the thread; it drains at once unless ``drain_now`` is false."""
        self._drain_now = drain_now
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="echomq-outbox", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def drain_once(self) -> int:
        """One drain; never raises (see the class docstring)."""
        try:
            n = drain(self.mq, using=self.using)
        except RedisUnavailable as err:
            log.debug("outbox not drained: %s", err)
            return 0
        except Exception as err:  # the database's: never let it stop the worker
            kind = type(err).__name__
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning(
                    "the commit outbox could not be drained: %s: %s",
                    kind,
                    str(err).split("\n")[0],
                )
            return 0
        finally:
            close_old_connections()
        if n:
            self.pushed += n
            log.info("pushed %d jobs or flows from the commit outbox", n)
        return n

    def _run(self) -> None:
        try:
            if self._drain_now:
                self.drain_once()
            while not self._stop.wait(self.interval_s):
                self.drain_once()
        finally:
            connections.close_all()
