"""The read API: pure, id-checked, never writes (seed 001; STYLE rule 5).

``Reads`` is mixed into ``EchoMQ``; every method takes a queue name and a job
id, validates both, raises ``JobNotFound`` for an unknown id and answers
empty results (not an error) for a job that is not a parent.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from ..core.exceptions import JobNotFound
from ..core.jobs import Dependencies, Job, JobState, decode_policy, row_error, to_text
from ..core.keyspace import JobKeys, validate_queue
from .errors import connection_error, reports_redis_down

ROWS_PER_TRIP = 500  # job rows per pipelined round trip (rows, states, exist)


def _texts(mapping: dict) -> dict[str, str]:
    return {to_text(k): to_text(v) for k, v in mapping.items()}


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


class Reads:
    """Read methods of ``EchoMQ``; expects ``self.client`` and ``self.keys``.
    Every public method raises ``RedisUnavailable`` when Redis is down."""

    def ping(self) -> None:
        """Return when Redis answers PING; raise ``RedisUnavailable`` naming
        the address the client tried (any redis-py error counts)."""
        try:
            self.client.ping()
        except redis.RedisError as err:
            raise connection_error(self.client, err) from err

    def _require(self, queue: str, job_id: str) -> str:
        key = self.keys.job(queue, job_id)
        if not self.client.exists(key):
            raise JobNotFound(f"job {job_id!r} not found in queue {queue!r}")
        return key

    @reports_redis_down
    def get_job(self, queue: str, job_id: str) -> Job:
        """The job row as a ``Job``. Raises ``JobNotFound``, ``ValueError``
        for a bad queue name or id."""
        row = self.client.hgetall(self.keys.job(queue, job_id))
        if not row:
            raise JobNotFound(f"job {job_id!r} not found in queue {queue!r}")
        job = Job.from_row(queue, job_id, row, mq=self)
        if job.state is JobState.ACTIVE:
            score = self.client.zscore(self.keys.queue(queue).active, job_id)
            job.lease_deadline = int(score) if score is not None else None
        return job

    @reports_redis_down
    def children_values(self, queue: str, job_id: str) -> dict[str, Any]:
        """``{child_ref: result}`` for the processed children (decoded JSON)."""
        keys = JobKeys.of(self._require(queue, job_id))
        raw = self.client.hgetall(keys.processed)
        return {to_text(k): json.loads(v) for k, v in raw.items()}

    @reports_redis_down
    def ignored_failures(self, queue: str, job_id: str) -> dict[str, str]:
        """``{child_ref: error}`` for dead children ignored by policy ``id``."""
        keys = JobKeys.of(self._require(queue, job_id))
        return _texts(self.client.hgetall(keys.unsuccessful))

    @reports_redis_down
    def dependencies(self, queue: str, job_id: str) -> Dependencies:
        """The parent's ``Dependencies``; empty for a job that is not a parent."""
        keys = JobKeys.of(self._require(queue, job_id))
        pipe = self.client.pipeline(transaction=False)
        for part in (keys.processed, keys.failed, keys.unsuccessful, keys.removed):
            pipe.hgetall(part)
        pipe.lrange(keys.children, 0, -1)
        pipe.get(keys.dependencies)
        processed, failed, ignored, removed, children, remaining = pipe.execute()
        deps = Dependencies(
            processed={to_text(k): json.loads(v) for k, v in processed.items()},
            failed=_texts(failed),
            ignored=_texts(ignored),
            removed=_texts(removed),
            remaining=int(remaining or 0),
        )
        resolved = set(deps.processed) | set(deps.failed) | set(deps.ignored) | set(deps.removed)
        deps.unprocessed = sorted(r for r in map(to_text, children) if r not in resolved)
        return deps

    @reports_redis_down
    def dependency_counts(self, queue: str, job_id: str) -> dict[str, int]:
        """Counts without the values: ``{processed, unprocessed, failed, ignored,
        removed, remaining, children}``."""
        keys = JobKeys.of(self._require(queue, job_id))
        pipe = self.client.pipeline(transaction=False)
        for part in (keys.processed, keys.failed, keys.unsuccessful, keys.removed):
            pipe.hlen(part)
        pipe.llen(keys.children)
        pipe.get(keys.dependencies)
        processed, failed, ignored, removed, children, remaining = pipe.execute()
        return {
            "processed": processed,
            "failed": failed,
            "ignored": ignored,
            "removed": removed,
            "unprocessed": children - processed - failed - ignored - removed,
            "remaining": int(remaining or 0),
            "children": children,
        }

    @reports_redis_down
    def get_flow(self, queue: str, job_id: str, depth: int | None = None) -> dict:
        """The tree under a job: ``{queue, id, ref, name, state, result, error,
        remaining, children: [...]}``, children sorted by ref, down to
        ``depth`` levels (None = all). Reads one level per round trip."""
        return self._tree(queue, job_id, depth, lambda is_root: (0, -1), paged=False)

    @reports_redis_down
    def flow_page(
        self,
        queue: str,
        job_id: str,
        start: int = 0,
        count: int = 100,
        depth: int = 2,
        fanout: int = 20,
    ) -> dict:
        """One page of the tree under a job, for a parent of any fan-in (the
        admin's flow page): the job's children ``start`` .. ``start + count -
        1`` in the order they were added, each with at most ``fanout`` of its
        own children, down to ``depth`` levels. Nodes as in ``get_flow`` plus
        ``total``, the node's whole child count. Reads one level per round
        trip, at most ``count * (1 + fanout + ...)`` rows."""
        return self._tree(
            queue,
            job_id,
            depth,
            lambda is_root: (start, start + count - 1) if is_root else (0, fanout - 1),
            paged=True,
        )

    def _tree(self, queue: str, job_id: str, depth: int | None, window, paged: bool) -> dict:
        """``get_flow`` / ``flow_page``: ``window(is_root)`` gives the LRANGE
        bounds of a node's children; ``paged`` keeps list order and adds
        ``total`` (else children are sorted by ref)."""
        self._require(queue, job_id)
        root = {"queue": queue, "id": job_id}
        level, d = [root], 0
        while level:
            pipe = self.client.pipeline(transaction=False)
            for node in level:
                keys = self.keys.job_keys(node["queue"], node["id"])
                pipe.hmget(keys.row, "name", "state", "result", "error", "parent_policy", "error.n")
                pipe.lrange(keys.children, *window(node is root))
                pipe.llen(keys.children)
                pipe.get(keys.dependencies)
            replies = pipe.execute()
            next_level = []
            for i, node in enumerate(level):
                (name, state, result, error, policy, pieces), kids, total, remaining = replies[
                    4 * i : 4 * i + 4
                ]
                ref = self.keys.job(node["queue"], node["id"])
                if pieces is not None:  # a long error, kept in pieces (jobs.row_error)
                    fields = [f"error.{n}" for n in range(2, int(pieces) + 1)]
                    rest = dict(zip(fields, self.client.hmget(ref, fields), strict=True))
                    error = row_error({"error": error, "error.n": pieces, **rest})
                node.update(
                    ref=ref,
                    name=to_text(name),
                    state=to_text(state),
                    result=json.loads(result) if result else None,
                    error=to_text(error),
                    policy=decode_policy(policy, node is not root),
                    remaining=int(remaining) if remaining is not None else None,
                    children=[],
                )
                if paged:
                    node["total"] = int(total)
                if depth is None or d < depth:
                    refs = list(map(to_text, kids))
                    for ref in refs if paged else sorted(refs):
                        cq, cid = self.keys.parse_ref(ref)
                        child = {"queue": cq, "id": cid}
                        node["children"].append(child)
                        next_level.append(child)
            level, d = next_level, d + 1
        return root

    @reports_redis_down
    def counts(self, queue: str) -> dict[str, int]:
        """Jobs per state index, plus ``outbox`` and ``deadletter`` lengths."""
        k = self.keys.queue(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(k.pending)
        for index in (k.active, k.delayed, k.completed, k.dead, k.awaiting):
            pipe.zcard(index)
        pipe.llen(k.outbox)
        pipe.llen(k.deadletter)
        pipe.zcard(k.prioritized)  # pending jobs with a priority (DESIGN §10.3)
        pending, active, delayed, completed, dead, awaiting, outbox, dl, ranked = pipe.execute()
        return {
            "pending": pending + ranked,
            "active": active,
            "delayed": delayed,
            "completed": completed,
            "dead": dead,
            "awaiting_children": awaiting,
            "outbox": outbox,
            "deadletter": dl,
        }

    @reports_redis_down
    def job_ids(
        self, queue: str, state: JobState | str, start: int = 0, end: int = -1
    ) -> list[str]:
        """Ids in one state index, oldest first (pending: the order claims
        take them, priorities included, DESIGN §10.3)."""
        key = self.keys.queue(queue).index(JobState(state))
        if JobState(state) is JobState.PENDING:
            ranked = self.keys.queue(queue).prioritized
            if not self.client.exists(ranked):
                return [to_text(v) for v in self.client.lrange(key, start, end)]
            pipe = self.client.pipeline(transaction=False)
            pipe.zrange(ranked, "-inf", "(0", byscore=True)  # priorities above 0
            pipe.lrange(key, 0, -1)  # priority 0
            pipe.zrange(ranked, 0, "+inf", byscore=True)  # priorities below 0
            ids = [to_text(v) for part in pipe.execute() for v in part]
            return ids[start : None if end == -1 else end + 1]
        return [to_text(v) for v in self.client.zrange(key, start, end)]

    def outbox_head(self, queue: str, count: int) -> list:
        """The first ``count`` entries of ``queue``'s outbox, raw (bytes or
        str, as the client decodes), not removed: the pump delivers them, then
        ``trim_outbox`` removes what was delivered."""
        return self.client.lrange(self.keys.queue(queue).outbox, 0, count - 1)

    @reports_redis_down
    def deadletters(self, queue: str, start: int = 0, end: int = -1) -> list[dict]:
        """Dead-lettered outbox entries: ``[{entry: {...}, reason, at (ms)}]``;
        an entry that is not JSON (a poison one) comes back as its raw text,
        with the reason the pump gave."""
        raw = self.client.lrange(self.keys.queue(queue).deadletter, start, end)
        out = []
        for item in raw:
            try:
                d = json.loads(item)
                if "reason" not in d or "entry" not in d:  # the keys the pump writes
                    raise KeyError("reason")
            except (ValueError, KeyError, TypeError):  # written by hand, or garbled
                d = {"entry": to_text(item), "reason": "unreadable dead-letter entry", "at": None}
            else:
                try:  # a poison entry stays its raw text beside the real reason
                    d["entry"] = json.loads(d["entry"])
                except (ValueError, TypeError):
                    pass
            out.append(d)
        return out

    # -- many rows at once (the admin mirror) --------------------------------
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
    def state_of(self, queue: str, job_id: str) -> JobState | None:
        """A job's state, one field read (None: no such job)."""
        value = self.client.hget(self.keys.job(queue, job_id), "state")
        return None if value is None else JobState(to_text(value))

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
