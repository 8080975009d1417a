"""What the admin mirror, the admin's pages and monitoring read in bulk
(docs/explanation/house.md, "protocol/"): many rows in one pipelined round trip, the
events stream (``P:{q}:events``) after an entry, a job's last change, the
age of the oldest pending job, the throughput of the last minute, and the
per-minute counters (``P:{q}:minutes``, written by ``lua/lib/emit.lua``).

``Probes`` is the part ``mq.probes``; it never writes, and runs no script.
"""

from __future__ import annotations

from typing import Any

from ..core.jobs import to_text
from ..core.keyspace import JobKeys, validate_queue
from .errors import reports_redis_down
from .wire import Part

ROWS_PER_TRIP = 500  # job rows per pipelined round trip (rows, states, exist)
# the minutes a queue's counter ring keeps (lua/lib/emit.lua MINUTES_KEPT)
MINUTES_KEPT = 1440
MINUTE_KINDS = {"a": "added", "c": "completed", "f": "failed", "d": "dead"}


def _stream_entries(entries: list) -> list[tuple[str, str | None, str | None]]:
    """``[(entry id, job id, event)]`` of XRANGE entries of a queue's
    ``events`` stream (fields ``e`` = event, ``id`` = job id). A ``removed``
    entry that retention wrote for a block of rows names their ids in one
    field, space-separated (ids hold no whitespace): one tuple per id."""
    out = []
    for eid, f in entries:
        eid, event = to_text(eid), to_text(f.get(b"e", f.get("e")))
        ids = to_text(f.get(b"id", f.get("id")))
        if ids and " " in ids:
            out.extend((eid, job_id, event) for job_id in ids.split(" "))
        else:
            out.append((eid, ids, event))
    return out


class Probes(Part):
    """Bulk reads of ``EchoMQ`` for the admin and monitoring (``mq.probes``).
    Every public method raises ``RedisUnavailable`` when Redis is down."""

    def _per_job(self, queue: str, ids, command: str, *args) -> dict[str, Any]:
        """``{id: reply}`` of one redis-py command on the row of each of
        ``ids``, pipelined ``ROWS_PER_TRIP`` at a time."""
        validate_queue(queue)
        ids = list(ids)
        out: dict[str, Any] = {}
        for i in range(0, len(ids), ROWS_PER_TRIP):
            chunk = ids[i : i + ROWS_PER_TRIP]
            pipe = self.client.pipeline(transaction=False)
            for job_id in chunk:
                getattr(pipe, command)(self.keys.job(queue, job_id), *args)
            out.update(zip(chunk, pipe.execute(), strict=False))
        return out

    @reports_redis_down
    def rows(self, queue: str, ids) -> dict[str, dict]:
        """``{id: HGETALL reply}`` (raw) for ``ids`` of ``queue``; an id whose
        row is gone maps to ``{}``. Decode one with ``Job.from_row``."""
        return self._per_job(queue, ids, "hgetall")

    @reports_redis_down
    def states(self, queue: str, ids) -> dict[str, str | None]:
        """``{id: state text}`` for ``ids`` of ``queue`` (None: no such job)."""
        return {j: to_text(v) for j, v in self._per_job(queue, ids, "hget", "state").items()}

    @reports_redis_down
    def exist(self, queue: str, ids) -> dict[str, bool]:
        """``{id: whether its row exists}`` for ``ids`` of ``queue``."""
        return {j: bool(n) for j, n in self._per_job(queue, ids, "exists").items()}

    @reports_redis_down
    def waiting_since(self, queue: str, job_id: str) -> int | None:
        """When (ms) a job last changed state (``updated_at``, else
        ``created_at``); None for no such job."""
        since, created = self.client.hmget(self.keys.job(queue, job_id), "updated_at", "created_at")
        stamp = since or created
        return None if stamp is None else int(stamp)

    # -- the event stream -------------------------------------------------
    @reports_redis_down
    def event_probe(self, queue: str, after: str, limit: int):
        """One round trip: ``(pending head id, first and last entry ids of the
        events stream, up to limit entries after after, claims)`` (entries
        from the start when ``after`` is ''), entries as ``[(entry id, job
        id, event)]``; ``claims`` is the ``lease:seq`` counter, which every
        claim batch increments (claims emit no event)."""
        k = self.keys.queue(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.lindex(k.pending, 0)
        pipe.xrange(k.events, "-", "+", count=1)
        pipe.xrevrange(k.events, "+", "-", count=1)
        pipe.xrange(k.events, f"({after}" if after else "-", "+", count=limit)
        pipe.get(k.lease_seq)
        head, first, last, entries, claims = pipe.execute()
        first_id = to_text(first[0][0]) if first else None
        last_id = to_text(last[0][0]) if last else None
        return to_text(head), first_id, last_id, _stream_entries(entries), int(claims or 0)

    @reports_redis_down
    def same_queue_children(self, queue: str, job_ids) -> set[str]:
        """The ids of the children in ``queue`` of each of ``job_ids`` (their
        ``:children`` lists, pipelined; children on other queues left out)."""
        ids = list(job_ids)
        out: set[str] = set()
        for i in range(0, len(ids), ROWS_PER_TRIP):
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids[i : i + ROWS_PER_TRIP]:
                pipe.lrange(JobKeys.of(self.keys.job(queue, job_id)).children, 0, -1)
            for refs in pipe.execute():
                for ref in map(to_text, refs):
                    cq, cid = self.keys.parse_ref(ref)
                    if cq == queue:
                        out.add(cid)
        return out

    @reports_redis_down
    def events_after(
        self, queue: str, after: str, limit: int
    ) -> list[tuple[str, str | None, str | None]]:
        """Up to ``limit`` entries of the events stream after entry id
        ``after``, as ``[(entry id, job id, event)]``."""
        entries = self.client.xrange(self.keys.queue(queue).events, f"({after}", "+", count=limit)
        return _stream_entries(entries)

    @reports_redis_down
    def finished_since(self, queue: str, since_ms: int) -> tuple[int, int]:
        """``(completed, dead)``: how many jobs of ``queue`` finished after
        ``since_ms`` (ms), from the ``completed`` and ``dead`` indexes
        (scored by finish time, ms); one round trip."""
        pipe = self.client.pipeline(transaction=False)
        k = self.keys.queue(queue)
        pipe.zcount(k.completed, f"({since_ms}", "+inf")
        pipe.zcount(k.dead, f"({since_ms}", "+inf")
        done, dead = pipe.execute()
        return int(done), int(dead)

    @reports_redis_down
    def minute_counts(self, queues, minutes: int = 60) -> tuple[int, dict[str, list[dict]]]:
        """The per-minute counters of ``queues`` (names) over the last
        ``minutes`` minutes (int, 1 to ``MINUTES_KEPT``), the current one
        last, by Redis's clock (docs/explanation/protocol.md#minute-counters).
        Returns ``(now_minute, {queue: [{minute, added, completed, failed,
        dead}]})``: ``minute`` is minutes since the epoch, a minute nobody
        counted in reads 0. Two round trips for every queue together (the
        slots' minutes, then the counts of the live ones); raises
        ``ValueError`` for a ``minutes`` outside the kept range, before any
        Redis I/O."""
        if type(minutes) is not int or not 1 <= minutes <= MINUTES_KEPT:
            raise ValueError(
                f"minutes {minutes!r}: the counters keep the last {MINUTES_KEPT} minutes "
                f"(a whole number from 1 to {MINUTES_KEPT})"
            )
        names = [validate_queue(q) for q in queues]
        seconds, _ = self.client.time()
        now = int(seconds) // 60
        span = range(now - minutes + 1, now + 1)
        rings = [self.keys.queue(q).minutes for q in names]
        # first the slots' minutes, then the counts of the slots that hold
        # the minute asked for: a quiet queue costs its stamps alone
        pipe = self.client.pipeline(transaction=False)
        for ring in rings:
            pipe.hmget(ring, [f"m{m % MINUTES_KEPT}" for m in span])
        fresh = [
            [m for m, stamp in zip(span, stamps, strict=True) if stamp and int(stamp) == m]
            for stamps in pipe.execute()
        ]
        pipe = self.client.pipeline(transaction=False)
        for ring, live in zip(rings, fresh, strict=True):
            if live:  # (HMGET needs a field)
                pipe.hmget(ring, [f"{k}{m % MINUTES_KEPT}" for m in live for k in MINUTE_KINDS])
        replies = iter(pipe.execute())
        out = {}
        for q, live in zip(names, fresh, strict=True):
            values = next(replies) if live else []
            counted = {
                m: {
                    kind: int(n or 0)
                    for kind, n in zip(
                        MINUTE_KINDS.values(), values[4 * i : 4 * i + 4], strict=True
                    )
                }
                for i, m in enumerate(live)
            }
            zero = dict.fromkeys(MINUTE_KINDS.values(), 0)
            out[q] = [{"minute": m, **counted.get(m, zero)} for m in span]
        return now, out
