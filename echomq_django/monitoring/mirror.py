"""The admin mirror: copy what Redis holds into ``MirroredJob`` / ``MirroredQueue``
(docs/explanation/house.md#monitoring). Redis stays the source of truth; this only reads it.

How a queue is refreshed (``mirror_queue``):

* incrementally, from its ``events`` stream: XRANGE after the last entry
  applied (``MirroredQueue.last_event_id``), HGETALL only the jobs those
  entries name (pipelined), upsert their rows; an ``added`` parent brings
  its same-queue children along (a same-queue leaf has no event of its
  own). ``claim`` emits no event: when the queue's claim counter
  (``lease:seq``, one INCR per claim batch) moved since the last pass, the
  mirror compares the ``active`` index with the rows it holds as active,
  both ways, and re-reads the difference; when the counts moved it also
  re-checks the rows it holds as ``delayed``. After any sequence of
  transitions and passes, the queue's counts, its listed rows and Redis
  agree (``tests/test_mirror_truth.py``);
* in full, when asked (``full=True``), on the first pass, or when the stream
  no longer reaches back to the last entry applied (trimmed past it, or the
  stream was deleted): every id in the state indexes is read, and a mirrored
  row of the queue that Redis no longer has is deleted (retention, remove:
  docs/explanation/lifecycle.md; the mirror stays as bounded as Redis).

Rows are upserted (``bulk_create(update_conflicts=True)`` on ``(queue,
job_id)``), so running a pass twice leaves the same rows. A job whose Redis
row is gone is marked, never deleted. The pump calls ``mirror_after_sweep``
after each sweep; a pass over an unchanged queue costs two Redis round trips
and one SELECT (plus, every ``TOUCH_EVERY``, an UPDATE of its ``mirrored_at``).
Every Redis read goes through the read API (``EchoMQ``'s ``Reads``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from ..core.jobs import Job, JobState, to_text
from ..core.keyspace import STATE_INDEX, validate_queue
from ..core.rows import PAYLOAD, row_get
from ..models import TEXT_LIMIT, MirroredJob, MirroredQueue
from ..protocol.client import EchoMQ
from ..runners import heartbeat

log = logging.getLogger("echomq_django.mirror")

ROW_BATCH = 500  # job rows per pipeline and per bulk upsert
EVENT_BATCH = 1000  # stream entries per XRANGE
INDEX_BATCH = 5000  # ids per LRANGE / ZRANGE window in a full rescan
RECHECK_LIMIT = 1000  # active ids / delayed rows re-checked per pass (un-evented moves)
SWEEP_MAX_EVENTS = 20000  # stream entries one after-sweep pass applies; the rest next sweep
TOUCH_EVERY = timedelta(seconds=5)  # an unchanged queue's mirrored_at is refreshed this often

UPDATE_FIELDS = [
    f.name for f in MirroredJob._meta.concrete_fields if f.name not in ("id", "queue", "job_id")
]


def ms_to_datetime(ms: Any) -> datetime | None:
    """A ms-since-epoch value (int, str or bytes) as an aware UTC datetime."""
    if ms in (None, b"", ""):
        return None
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)


def _trim(value: Any) -> tuple[str, bool]:
    text = to_text(value) or ""
    if len(text) > TEXT_LIMIT:
        return text[:TEXT_LIMIT], True
    return text, False


def job_from_row(mq, queue: str, job_id: str, row: dict, now: datetime) -> MirroredJob:
    """An unsaved ``MirroredJob`` for an HGETALL reply (bytes or str), decoded
    by ``Job.from_row`` (the one decoder).

    ``payload`` / ``result`` stay the JSON text Redis holds, trimmed to
    ``TEXT_LIMIT`` characters like ``error`` (``truncated`` set if any was).
    Raises ``ValueError`` for a row that does not decode.
    """
    job = Job.from_row(queue, job_id, row, mq=mq)
    raw = {to_text(k): v for k, v in row.items()}
    payload, cut_p = _trim(row_get(raw, PAYLOAD))
    result, cut_r = _trim(raw.get("result"))
    error, cut_e = _trim(job.error)
    return MirroredJob(
        queue=queue,
        job_id=job_id,
        name=job.name[:255],
        state=job.state.value,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        parent_queue=job.parent_queue or "",
        parent_id=job.parent or "",
        parent_policy=job.parent_policy or "",
        created_at=ms_to_datetime(job.created_at),
        started_at=ms_to_datetime(job.started_at),
        finished_at=ms_to_datetime(job.finished_at),
        payload=payload,
        result=result,
        error=error,
        truncated=cut_p or cut_r or cut_e,
        progress=to_text(raw.get("progress")) or "",  # bounded by core/live.py
        gone_from_redis=False,
        mirrored_at=now,
    )


def read_rows(mq: EchoMQ, queue: str, ids) -> dict[str, dict]:
    """``{id: HGETALL reply}`` for ``ids`` of ``queue``; an id whose row is
    gone maps to ``{}`` (``EchoMQ.rows``)."""
    return mq.probes.rows(queue, ids)


def store_rows(mq, queue: str, rows: dict[str, dict], now: datetime) -> tuple[int, int]:
    """Upsert the present rows, delete the ``{}`` ones: a job retention,
    remove or cancel took leaves the mirror in the pass that sees it go, so
    the database stays bounded too (docs/explanation/lifecycle.md). Returns ``(upserted,
    deleted)``. A row that does not decode is logged and skipped."""
    present = []
    for job_id, row in rows.items():
        if row:
            try:
                present.append(job_from_row(mq, queue, job_id, row, now))
            except (ValueError, TypeError) as err:
                log.warning(
                    "mirror: skipped job %s/%s, its row does not decode: %s", queue, job_id, err
                )
    gone = [job_id for job_id, row in rows.items() if not row]
    for i in range(0, len(present), ROW_BATCH):
        MirroredJob.objects.bulk_create(
            present[i : i + ROW_BATCH],
            update_conflicts=True,
            unique_fields=["queue", "job_id"],
            update_fields=UPDATE_FIELDS,
        )
    deleted = 0
    for i in range(0, len(gone), ROW_BATCH):
        deleted += MirroredJob.objects.filter(
            queue=queue, job_id__in=gone[i : i + ROW_BATCH]
        ).delete()[0]
    return len(present), deleted


def mirror_jobs(mq, pairs) -> int:
    """Re-read the given ``(queue, id)`` jobs now (after a retry, or to fill
    a link the mirror has not reached yet); returns rows upserted."""
    by_queue: dict[str, list[str]] = {}
    for queue, job_id in pairs:
        by_queue.setdefault(queue, []).append(job_id)
    now, total = timezone.now(), 0
    with transaction.atomic():
        for queue, ids in by_queue.items():
            total += store_rows(mq, queue, read_rows(mq, queue, dict.fromkeys(ids)), now)[0]
    return total


def _stream_id(value: Any) -> tuple[int, int]:
    ms, _, seq = (to_text(value) or "0-0").partition("-")
    return int(ms), int(seq or 0)


def _index_ids(mq: EchoMQ, queue: str) -> set[str]:
    """Every id in the queue's six state indexes, read in windows."""
    ids: set[str] = set()
    for state in STATE_INDEX:
        start = 0
        while True:
            window = mq.job_ids(queue, state, start, start + INDEX_BATCH - 1)
            ids.update(window)
            if len(window) < INDEX_BATCH:
                break
            start += INDEX_BATCH
    return ids


def _gone_rows(mq, queue: str, seen: set[str]) -> dict[str, dict]:
    """``{id: {}}`` for mirrored rows of ``queue`` not in ``seen`` whose
    Redis row no longer exists (checked: a job may have moved mid-scan)."""
    others = [
        j
        for j in MirroredJob.objects.filter(queue=queue, gone_from_redis=False)
        .values_list("job_id", flat=True)
        .iterator()
        if j not in seen
    ]
    return {j: {} for j, there in mq.probes.exist(queue, others).items() if not there}


def _active_drift(mq: EchoMQ, queue: str) -> set[str]:
    """Ids whose membership of ``active`` differs between Redis and the
    mirror, both ways. Run when the queue's claim counter moved: ``claim``
    emits no event (a job per batch would cost the hot path), so a claim is
    found by comparing the active index, which holds what workers hold."""
    in_redis: set[str] = set()
    start = 0
    while True:
        window = mq.job_ids(queue, JobState.ACTIVE, start, start + INDEX_BATCH - 1)
        in_redis.update(window)
        if len(window) < INDEX_BATCH:
            break
        start += INDEX_BATCH
    mirrored = set(
        MirroredJob.objects.filter(queue=queue, state="active", gone_from_redis=False).values_list(
            "job_id", flat=True
        )
    )
    return in_redis ^ mirrored


def _delayed_drift(mq: EchoMQ, queue: str) -> set[str]:
    """Mirrored ``delayed`` rows that are not delayed any more (a safety net
    for a move out of ``delayed`` that emitted no event; ``promote_delayed``
    does emit). Bounded by ``RECHECK_LIMIT``."""
    delayed = list(
        MirroredJob.objects.filter(queue=queue, state="delayed", gone_from_redis=False).values_list(
            "job_id", flat=True
        )[:RECHECK_LIMIT]
    )
    return {j for j, state in mq.probes.states(queue, delayed).items() if state != JobState.DELAYED}


def _needs_rescan(stored: str, first_id: str | None, last_id: str | None) -> bool:
    """True when the stream cannot take the mirror forward from ``stored``:
    nothing applied yet, the stream trimmed past it, or the stream gone or
    recreated (its newest entry older than what was applied)."""
    if not stored:
        return True
    if stored == "0-0":  # the stream was empty at the last rescan
        return False
    if last_id is None or _stream_id(last_id) < _stream_id(stored):
        return True
    return _stream_id(first_id) > _stream_id(stored)


def _pending_age(mq: EchoMQ, queue: str) -> float | None:
    """Seconds the longest-waiting of ``queue``'s heads has waited since it
    became pending (``Probes.heads_since``), or None."""
    stamp = mq.probes.heads_since([queue])[queue]
    return None if stamp is None else max(0.0, (mq.clock() - stamp) / 1000)


def _follow(
    mq: EchoMQ, queue: str, after: str, entries: list, limit: int, max_events: int | None
) -> tuple[set[str], str, int]:
    """Apply stream entries from ``entries`` (the first page after ``after``,
    as ``[(entry id, job id, event)]``) on, ``limit`` per page, up to
    ``max_events``; returns the ids they name (with the same-queue children
    of each parent an ``added`` event names: a same-queue leaf is announced
    by its parent's event only), the last entry id read, and how many
    entries were read."""
    touched: set[str] = set()
    added: set[str] = set()
    last, count = after, 0
    while entries:
        for entry_id, job_id, event in entries:
            if job_id:
                touched.add(job_id)
                if event == "added":
                    added.add(job_id)
            last = entry_id
        count += len(entries)
        if len(entries) < limit or (max_events and count >= max_events):
            break
        entries = mq.probes.events_after(queue, last, limit)
    if added:
        touched |= mq.probes.same_queue_children(queue, added)
    return touched, last, count


def mirror_queue(mq, queue: str, full: bool = False, max_events: int | None = None) -> dict:
    """Refresh one queue's mirror; returns what it did:
    ``{full: bool, events: int, jobs: int, gone: int, changed: bool}``
    (``jobs`` rows upserted, ``gone`` rows newly marked gone).

    ``max_events`` bounds the stream entries applied in this pass (None:
    all); the rest are applied on the next pass. Raises ``RedisUnavailable``
    when Redis cannot be reached, other redis-py errors and database errors
    unchanged.
    """
    validate_queue(queue)
    saved = MirroredQueue.objects.filter(queue=queue).first()
    stored = saved.last_event_id if saved else ""
    limit = EVENT_BATCH if max_events is None else max(1, min(EVENT_BATCH, max_events))
    first_id, last_id, entries, claims = mq.probes.event_probe(queue, stored, limit)
    counts = mq.counts(queue)
    now = timezone.now()
    report = {
        "full": full or _needs_rescan(stored, first_id, last_id),
        "events": 0,
        "jobs": 0,
        "gone": 0,
        "changed": True,
    }

    if report["full"]:
        new_last = last_id or "0-0"  # read before the scan: later events are re-read
        seen = _index_ids(mq, queue)
        rows = read_rows(mq, queue, seen)
        rows.update(_gone_rows(mq, queue, {j for j, row in rows.items() if row}))
    else:
        touched, new_last, report["events"] = _follow(mq, queue, stored, entries, limit, max_events)
        moved = counts != saved.counts() or claims != saved.claims_seen
        if claims != saved.claims_seen:
            touched |= _active_drift(mq, queue)
        if counts != saved.counts():
            touched |= _delayed_drift(mq, queue)
        if not touched and not moved:
            report["changed"] = False
            if now - saved.mirrored_at >= TOUCH_EVERY:
                MirroredQueue.objects.filter(queue=queue).update(
                    mirrored_at=now, oldest_pending_age_s=_pending_age(mq, queue)
                )
            return report
        rows = read_rows(mq, queue, touched)

    age = _pending_age(mq, queue)
    with transaction.atomic():
        report["jobs"], report["gone"] = store_rows(mq, queue, rows, now)
        MirroredQueue.objects.update_or_create(
            queue=queue,
            defaults={
                **counts,
                "oldest_pending_age_s": age,
                "last_event_id": new_last,
                "claims_seen": claims,
                "mirrored_at": now,
            },
        )
    return report


def mirror_queues(mq, queues, full: bool = False, max_events: int | None = None) -> dict:
    """``mirror_queue`` for each of ``queues``; returns ``{queue: report}``.
    docs/explanation/house.md#monitoring (the admin mirror)."""
    return {q: mirror_queue(mq, q, full=full, max_events=max_events) for q in queues}


def mirror_targets(mq: EchoMQ, extra=()) -> list[str]:
    """The queues to mirror when none are named: every known queue (``P:queues``,
    ``ECHOMQ["QUEUES"]``, live processes' queues: ``heartbeat.known_queues``),
    the ones already mirrored, and ``extra``; sorted, without repeats."""
    names = set(heartbeat.known_queues(mq, extra))
    names |= set(MirroredQueue.objects.values_list("queue", flat=True))
    return sorted(names)


def mirror_after_sweep(pump, reports: dict) -> None:
    """The pump's after-sweep hook (``Pump(..., after_sweep=[mirror_after_sweep])``):
    mirror the swept queues incrementally, at most ``SWEEP_MAX_EVENTS``
    entries each. Never raises into the pump: a failure is logged and the
    next sweep tries again."""
    try:
        if not connection.in_atomic_block:
            close_old_connections()  # a long-running pump outlives DB connections
        mirror_queues(pump.mq, list(reports), max_events=SWEEP_MAX_EVENTS)
    except Exception:
        log.exception(
            "admin mirror failed after a sweep of %s; the pump carries on", ", ".join(reports)
        )
