"""What the admin mirror, the admin's pages and monitoring read in bulk
(docs/explanation/house.md, "protocol/"): many rows in one pipelined round trip, the
events stream (``P:{q}:events``) after an entry, a job's last change, the
age of the oldest pending job, the throughput of the last minute, and the
per-minute counters (``P:{q}:minutes``, written by ``lua/lib/emit.lua``;
a long range summed on the server by ``lua/sum_minutes.lua``).

``Probes`` is the part ``mq.probes``; it never writes.
"""

from __future__ import annotations

from typing import Any

from ..core.events import run_ids
from ..core.jobs import to_text
from ..core.keyspace import JobKeys, validate_queue
from ..core.rows import (
    CREATED,
    PARENT_INC,
    STATE_FIELDS,
    created_of,
    pending_ids,
    pick_fields,
    row_fields,
    row_state,
)
from .control.groups import GROUPS_LISTED
from .errors import reports_redis_down
from .wire import Part

# a job's last move, else its add (rows of either version; core.rows.created_of)
_SINCE = row_fields(("updated_at", CREATED, PARENT_INC))


def _since(values: list) -> list:
    """``[updated_at, created]`` of an ``HMGET`` of ``_SINCE``."""
    since, created, inc = pick_fields(("updated_at", CREATED, PARENT_INC), values)
    return [since, created_of(created, inc)]


ROWS_PER_TRIP = 500  # job rows per pipelined round trip (rows, states, exist)
# the minutes a queue's counter ring keeps (lua/lib/emit.lua MINUTES_KEPT)
MINUTES_KEPT = 1440
MINUTE_KINDS = {"a": "added", "c": "completed", "f": "failed", "d": "dead"}
KINDS = tuple(MINUTE_KINDS.values())
COUNT_READS = 11  # the reads count_commands queues


def count_commands(pipe, k) -> None:
    """Queue on ``pipe`` (a redis-py pipeline) the ``COUNT_READS`` reads
    of queue keys ``k`` (``QueueKeys``) that ``count_replies`` decodes."""
    pipe.llen(k.pending)
    # the ids its ranges hold beyond one entry each (protocol.md#ranges-in-pending)
    pipe.get(k.pending_ranged)
    for index in (k.active, k.delayed, k.completed, k.dead, k.awaiting):
        pipe.zcard(index)
    pipe.llen(k.outbox)
    pipe.llen(k.deadletter)
    pipe.zcard(k.prioritized)  # pending jobs with a priority
    pipe.get(k.groups_pending)  # pending jobs in groups (docs/explanation/protocol.md#groups)


def count_replies(replies) -> dict[str, int]:
    """Jobs per state index, plus ``outbox`` and ``deadletter`` lengths,
    from the replies to ``count_commands``."""
    pending, ranged, active, delayed, completed, dead, awaiting, outbox, dl, ranked, grouped = (
        replies
    )
    return {
        "pending": pending + int(ranged or 0) + ranked + int(grouped or 0),
        "active": active,
        "delayed": delayed,
        "completed": completed,
        "dead": dead,
        "awaiting_children": awaiting,
        "outbox": outbox,
        "deadletter": dl,
    }


def backlog_commands(pipe, k) -> None:
    """Queue on ``pipe`` the three reads of the durable signal events'
    backlog of queue keys ``k`` that ``backlog_of`` decodes."""
    pipe.xlen(k.signals)
    pipe.llen(k.signal_deadletter)
    pipe.xrange(k.signals, count=1)


def backlog_of(replies, now_ms: int) -> dict:
    """``{"pending", "deadlettered", "oldest_ms"}`` (``oldest_ms``: the age
    at ``now_ms`` of the oldest event not dispatched, None when none) from
    the replies to ``backlog_commands``."""
    pending, lettered, first = replies
    oldest = None
    if first:
        oldest = max(0, now_ms - int(to_text(first[0][0]).partition("-")[0]))
    return {"pending": pending, "deadlettered": lettered, "oldest_ms": oldest}


def _stream_entries(entries: list) -> list[tuple[str, str | None, str | None]]:
    """``[(entry id, job id, event)]`` of XRANGE entries of a queue's
    ``events`` stream (fields ``e`` = event, ``id`` = job id). An entry
    naming several jobs (retention's ``removed`` for a block of rows, a
    claim's ``active``, one ``write_reports`` call's ``progress``, a flow's
    ``added`` run) names their ids in one field, space-separated, later ones
    maybe relative to the first (``run_ids``): one tuple per whole id."""
    out = []
    for eid, f in entries:
        eid, event = to_text(eid), to_text(f.get(b"e", f.get("e")))
        ids = to_text(f.get(b"id", f.get("id")))
        if ids and " " in ids:
            out.extend((eid, job_id, event) for job_id in run_ids(ids))
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
        got = self._per_job(queue, ids, "hmget", *STATE_FIELDS)
        return {j: to_text(row_state(v)) for j, v in got.items()}

    @reports_redis_down
    def exist(self, queue: str, ids) -> dict[str, bool]:
        """``{id: whether its row exists}`` for ``ids`` of ``queue``."""
        return {j: bool(n) for j, n in self._per_job(queue, ids, "exists").items()}

    @reports_redis_down
    def heads_since(self, queues) -> dict[str, int | None]:
        """``{queue: ms}``: when the longest-waiting of each queue's heads
        became pending (its ``updated_at``, else its ``created_at``), or None
        when none waits (docs/reference/stats.md#queues). The heads are the
        first of each claim order the queue keeps: its ``pending`` list's,
        its ``prioritized`` zset's below and from priority 0, and the same
        three of each group with work (``groups:known``, at most
        ``GROUPS_LISTED`` of them by name, as the stats list them), so a fair
        queue's grouped jobs count. At most three round trips whatever the
        number of queues (two when no queue has groups). Raises ``ValueError`` for a
        bad name, ``RedisUnavailable``."""
        names = [validate_queue(q) for q in queues]
        pipe = self.client.pipeline(transaction=False)
        for q in names:
            k = self.keys.queue(q)
            _head_commands(pipe, k.pending, k.prioritized)
            pipe.smembers(k.groups_known)
        replies = iter(pipe.execute())
        heads: dict[str, list[str]] = {}
        groups: dict[str, list[str]] = {}
        for q in names:
            heads[q] = _head_ids(replies)
            groups[q] = sorted(to_text(g) for g in next(replies))[:GROUPS_LISTED]
        if any(groups.values()):
            pipe = self.client.pipeline(transaction=False)
            for q, listed in groups.items():
                k = self.keys.queue(q)
                for g in listed:
                    _head_commands(pipe, k.group(g, "pending"), k.group(g, "prioritized"))
            replies = iter(pipe.execute())
            for q, listed in groups.items():
                for _ in listed:
                    heads[q] += _head_ids(replies)
        stamps = iter([])
        if any(heads.values()):
            pipe = self.client.pipeline(transaction=False)
            for q, ids in heads.items():
                for job_id in ids:
                    pipe.hmget(self.keys.job(q, job_id), *_SINCE)
            stamps = iter(pipe.execute())
        out = {}
        for q, ids in heads.items():
            seen = [since or created for since, created in (_since(next(stamps)) for _ in ids)]
            seen = [int(v) for v in seen if v is not None]
            out[q] = min(seen) if seen else None
        return out

    # -- the event stream -------------------------------------------------
    @reports_redis_down
    def event_probe(self, queue: str, after: str, limit: int):
        """One round trip: ``(first and last entry ids of the events stream,
        up to limit entries after after, claims)`` (entries from the start
        when ``after`` is ''), entries as ``[(entry id, job
        id, event)]``; ``claims`` is the ``lease:seq`` counter, which every
        claim batch increments (claims emit no event)."""
        k = self.keys.queue(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.xrange(k.events, "-", "+", count=1)
        pipe.xrevrange(k.events, "+", "-", count=1)
        pipe.xrange(k.events, f"({after}" if after else "-", "+", count=limit)
        pipe.get(k.lease_seq)
        first, last, entries, claims = pipe.execute()
        first_id = to_text(first[0][0]) if first else None
        last_id = to_text(last[0][0]) if last else None
        return first_id, last_id, _stream_entries(entries), int(claims or 0)

    @reports_redis_down
    def same_queue_children(self, queue: str, job_ids) -> set[str]:
        """The ids of the children in ``queue`` of each of ``job_ids`` (their
        ``:children`` lists, pipelined; children on other queues left out)."""
        ids = list(job_ids)
        out: set[str] = set()
        for i in range(0, len(ids), ROWS_PER_TRIP):
            pipe = self.client.pipeline(transaction=False)
            batch = ids[i : i + ROWS_PER_TRIP]
            for job_id in batch:
                pipe.lrange(JobKeys.of(self.keys.job(queue, job_id)).children, 0, -1)
            for job_id, refs in zip(batch, pipe.execute(), strict=True):
                for key in self.keys.child_keys(queue, job_id, refs):
                    cq, cid = self.keys.parse_ref(key)
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
    def minute_counts(
        self, queues, minutes: int = 60, per: int = 1
    ) -> tuple[int, dict[str, list[dict]]]:
        """The per-minute counters of ``queues`` (names) over the last
        ``minutes`` minutes (int, 1 to ``MINUTES_KEPT``), the current one
        last, by Redis's clock (docs/explanation/protocol.md#minute-counters).
        Returns ``(now_minute, {queue: [{minute, minutes, added, completed,
        failed, dead}]})``: one row per ``per`` consecutive minutes (int >=
        1; the last row may hold fewer), ``minute`` its first in minutes
        since the epoch, ``minutes`` how many it sums; a minute nobody
        counted in reads 0. Two round trips for every queue together
        (Redis's ``TIME``, then the rings); raises ``ValueError`` for a
        ``minutes`` or ``per`` outside its range, before any Redis I/O."""
        now, out = self.overview(queues, minutes=minutes, stats=False, per=per)
        return now, {q: row["minutes"] for q, row in out.items()}

    @reports_redis_down
    def overview(
        self,
        queues,
        now_ms: int | None = None,
        window_ms: int = 60_000,
        minutes: int | None = None,
        stats: bool = True,
        per: int = 1,
    ) -> tuple[int | None, dict[str, dict]]:
        """Everything the stats and the dashboard show of ``queues`` (names),
        in a fixed number of pipelined round trips whatever their number
        (docs/howto/operate.md#the-dashboard): Redis's ``TIME`` when
        ``minutes`` is given, one bulk read, and ``heads_since``.
        Per queue, with ``stats``: ``counts`` (as ``mq.counts``),
        ``finished`` (``(completed, dead)`` since ``now_ms - window_ms``,
        ms; ``now_ms`` default: the clock), ``signals`` (as
        ``mq.signal_events.backlog``), ``head_since`` (``heads_since``: ms
        the longest-waiting head became pending; None when nothing waits), ``paused``; with
        ``minutes`` (1 to ``MINUTES_KEPT``), ``minutes``: the rows
        ``minute_counts`` answers for ``per`` (minutes a row sums: with
        ``per`` > 1 each ring is summed on the server by
        ``lua/sum_minutes.lua``, a few integers a queue over the wire).
        Returns ``(now_minute or None, {queue: dict})``. Raises
        ``ValueError`` for a bad name, ``minutes`` or ``per``,
        before any Redis I/O."""
        if minutes is not None and (type(minutes) is not int or not 1 <= minutes <= MINUTES_KEPT):
            raise ValueError(
                f"minutes {minutes!r}: the counters keep the last {MINUTES_KEPT} minutes "
                f"(a whole number from 1 to {MINUTES_KEPT})"
            )
        if type(per) is not int or not 1 <= per <= MINUTES_KEPT:
            raise ValueError(
                f"per {per!r}: a row sums a whole number of minutes from 1 to {MINUTES_KEPT}"
            )
        names = [validate_queue(q) for q in queues]
        now = self.clock() if now_ms is None else now_ms
        now_minute, span = None, range(0)
        if minutes is not None:
            seconds, _ = self.client.time()
            now_minute = int(seconds) // 60
            span = range(now_minute - minutes + 1, now_minute + 1)
        whole = len(span) >= MINUTES_KEPT // 4  # a quarter of the ring or more: read it all
        pipe = self.client.pipeline(transaction=False)
        for q in names:
            k = self.keys.queue(q)
            if stats:
                count_commands(pipe, k)
                pipe.zcount(k.completed, f"({now - window_ms}", "+inf")
                pipe.zcount(k.dead, f"({now - window_ms}", "+inf")
                backlog_commands(pipe, k)
                pipe.exists(k.paused)
            if minutes is not None and per == 1:
                if whole:
                    pipe.hgetall(k.minutes)
                else:
                    pipe.hmget(k.minutes, [f"{f}{m % MINUTES_KEPT}" for m in span for f in "macfd"])
        replies = iter(pipe.execute())
        out: dict[str, dict] = {q: {} for q in names}
        for q in names:
            row = out[q]
            if stats:
                row["counts"] = count_replies([next(replies) for _ in range(COUNT_READS)])
                row["finished"] = (int(next(replies)), int(next(replies)))
                row["signals"] = backlog_of([next(replies) for _ in range(3)], now)
                row["paused"] = bool(next(replies))
            if minutes is not None and per == 1:
                row["minutes"] = _ring_rows(next(replies), span, whole)
        if minutes is not None and per > 1:
            calls = [
                ("sum_minutes", [self.keys.queue(q).minutes], [span.start, len(span), per])
                for q in names
            ]
            for q, sums in zip(names, self.scripts.run_many(calls), strict=True):
                if isinstance(sums, Exception):
                    raise sums
                out[q]["minutes"] = _summed_rows(sums, span, per)
        if stats:
            for q, since in self.heads_since(names).items():
                out[q]["head_since"] = since
        return now_minute, out


def _head_commands(pipe, pending: str, prioritized: str) -> None:
    """Queue the reads of the heads of one claim order's keys, in claim
    order: the ``prioritized`` zset's first scored under 0 (priorities above
    0), the ``pending`` list's first (priority 0), the zset's first scored
    from 0 (priorities below 0)."""
    pipe.zrange(prioritized, "-inf", "(0", byscore=True, offset=0, num=1)
    pipe.lindex(pending, 0)
    pipe.zrange(prioritized, 0, "+inf", byscore=True, offset=0, num=1)


def _head_ids(replies) -> list[str]:
    """The ids ``_head_commands``' three replies (next from ``replies``) name."""
    above, zero, below = next(replies), next(replies), next(replies)
    # a range entry's first id is the one it holds first (protocol.md#ranges-in-pending)
    zero = [] if zero is None else pending_ids([zero])[:1]
    return [to_text(i) for i in (*above, *zero, *below)]


def _summed_rows(sums: list, span: range, per: int) -> list[dict]:
    """``minute_counts``'s rows of ``per`` minutes each from
    ``lua/sum_minutes.lua``'s reply (four counts a row, in ``KINDS``
    order) for the minutes of ``span``."""
    rows = []
    for i, first in enumerate(range(span.start, span.stop, per)):
        row = {"minute": first, "minutes": min(per, span.stop - first)}
        row.update(zip(KINDS, (int(n) for n in sums[4 * i : 4 * i + 4]), strict=True))
        rows.append(row)
    return rows


def _ring_rows(reply, span: range, whole: bool) -> list[dict]:
    """A ring's rows for the minutes of ``span`` (``minute_counts``'s
    shape) from its ``HGETALL`` (``whole``) or its ``HMGET`` of the five
    fields (``m``, then the ``MINUTE_KINDS``) of each minute, in order."""
    counted = {}
    if whole:  # only the slots that hold a minute of span: a quiet ring costs nothing
        fields = {to_text(f): v for f, v in reply.items()}
        for field, stamp in fields.items():
            if field[0] == "m" and int(stamp) in span:
                slot = field[1:]
                counted[int(stamp)] = [fields.get(f"{f}{slot}") for f in MINUTE_KINDS]
    else:
        for i, m in enumerate(span):
            stamp, *values = reply[5 * i : 5 * i + 5]
            if stamp is not None and int(stamp) == m:
                counted[m] = values
    zero = dict.fromkeys(KINDS, 0)
    rows = [{"minute": m, "minutes": 1, **zero} for m in span]
    for m, values in counted.items():
        rows[m - span.start].update(zip(KINDS, (int(n or 0) for n in values), strict=True))
    return rows
