"""The read API: pure, id-checked, never writes.

``Reads`` is the base class of ``EchoMQ``: every method takes a queue name
and a job id, validates both, raises ``JobNotFound`` for an unknown id and
answers empty results (not an error) for a job that is not a parent. What
only the admin mirror and monitoring read in bulk is on ``mq.probes``
(``probes.py``). Its one script, ``lua/job_logs.lua``, writes nothing.
"""

from __future__ import annotations

import json

import redis

from ..core.exceptions import JobNotFound
from ..core.jobs import Dependencies, Job, JobState, decode_policy, row_error, to_text
from ..core.keyspace import JobKeys, whole_number
from ..core.refs import JobRef, Page, RefDict, as_ref
from ..core.rows import (
    CREATED,
    KIDS,
    NAME,
    PARENT_INC,
    PENDING,
    POLICY,
    STATE,
    STATE_FIELDS,
    created_of,
    pending_ids,
    pick_fields,
    row_fields,
    row_state,
)
from .errors import connection_error, reports_redis_down
from .probes import count_commands, count_replies
from .wire import Part

ROWS_PER_TRIP = 500  # job rows per pipelined round trip (rows, states, exist)
ERRORS_KEPT = 10  # failed attempts' errors a job keeps: the row's last, 9 earlier (lua/fail.lua)
PAGE_MAX = 10_000  # children a page of a paged read, at most (docs/howto/read-flows.md#paged-reads)

# the row fields a tree reads per node; a page of it adds the node's times (ms)
_TREE_FIELDS = (NAME, STATE, "result", "error", POLICY, "error.n")
_TIMES = ("created_at", "started_at", "finished_at")  # a page's keys for them
_PAGE_FIELDS = (*_TREE_FIELDS, CREATED, "started_at", "finished_at", PARENT_INC)
_ASK = {False: row_fields(_TREE_FIELDS), True: row_fields(_PAGE_FIELDS)}  # rows of either version


class Reads(Part):
    """The read API, the base of ``EchoMQ`` (as BullMQ's ``Queue`` extends
    its ``QueueGetters``). Every public method raises ``RedisUnavailable``
    when Redis is down."""

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
    def get_job(self, queue, job_id: str | None = None) -> Job:
        """The job row as a ``Job``, without its lease token: a read is not
        the claim, so the calls a running job makes under its lease
        (``add_children``, ``update_payload``, ``report_progress``, ``log``)
        raise ``JobNotActive`` on it. The job is ``(queue, job_id)`` or,
        with ``job_id`` None, a ``JobRef`` / ``(queue, id)`` / ``"queue/id"``
        as ``queue``. Raises ``JobNotFound``, ``ValueError`` for a bad queue
        name, id or ref."""
        if job_id is None:
            queue, job_id = as_ref(queue, self.keys)
        row = self.client.hgetall(self.keys.job(queue, job_id))
        if not row:
            raise JobNotFound(f"job {job_id!r} not found in queue {queue!r}")
        job = Job.from_row(queue, job_id, row, mq=self)
        job.lease = None  # the claimer's secret (docs/explanation/protocol.md#leases-and-recovery)
        if job.state is JobState.ACTIVE:
            score = self.client.zscore(self.keys.queue(queue).active, job_id)
            job.lease_deadline = int(score) if score is not None else None
        return job

    @reports_redis_down
    def job_logs(
        self, queue, job_id: str | None = None, start: int = 0, end: int = -1
    ) -> list[str]:
        """The job log's lines ``start`` .. ``end`` (ints, inclusive; negative
        counts from the newest, as LRANGE), oldest first: the newest
        ``KEEP_LOGS`` lines its handler wrote with ``job.log``, read in one
        round trip (``lua/job_logs.lua``: the oldest line is a field of the
        row, the others a list). The job is
        ``(queue, job_id)`` or, with ``job_id`` None, a ``JobRef`` /
        ``(queue, id)`` / ``"queue/id"`` as ``queue``. Raises ``JobNotFound``
        (the log goes with its job), ``ValueError`` for a bad name or a
        start / end that is not an int (or is 2**63 or more either way).
        docs/howto/progress-and-logs.md#read-them-back"""
        if job_id is None:
            queue, job_id = as_ref(queue, self.keys)
        for name, value in (("start", start), ("end", end)):
            if not isinstance(value, int) or isinstance(value, bool) or abs(value) >= 2**63:
                raise ValueError(f"{name} must be an int line index below 2**63, got {value!r}")
        keys = JobKeys.of(self.keys.job(queue, job_id))
        lines = self.scripts.run("job_logs", [keys.row, keys.logs], [queue, job_id, start, end])
        return [to_text(line) for line in lines]

    @reports_redis_down
    def attempt_errors(self, queue: str, job_id: str) -> list[str]:
        """The errors of the job's failed attempts, oldest first: those of
        earlier attempts (``P:{q}:job:<id>:errors``), then the row's
        ``error`` (the last), the newest ``ERRORS_KEPT`` at most. An error a
        script wrote for the job (``cancelled``, a child's failure) counts
        as its last. Raises ``JobNotFound``, ``ValueError`` for a bad name.
        docs/explanation/protocol.md#the-errors-of-earlier-attempts"""
        keys = self.keys.job_keys(queue, job_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(keys.errors, 0, -1)
        pipe.hmget(keys.row, "error", "error.n", *STATE_FIELDS)
        earlier, (first, n, *state) = pipe.execute()
        state = row_state(state)
        if state is None:
            raise JobNotFound(f"job {job_id!r} not found in queue {queue!r}")
        last = (
            row_error({"error": first, "error.n": n}) if n is None else self._whole_error(keys.row)
        )
        out = [to_text(e) for e in earlier] + ([last] if last is not None else [])
        return [self.keys.unkey(e) for e in out[-ERRORS_KEPT:]]

    def _whole_error(self, row: str) -> str | None:
        """A row's whole error, read with its pieces (``jobs.row_error``)."""
        return row_error({to_text(k): v for k, v in self.client.hgetall(row).items()})

    @reports_redis_down
    def children_values(
        self, queue: str, job_id: str, cursor: int = 0, count: int | None = None
    ) -> RefDict | Page[RefDict]:
        """``{JobRef: result}`` for the processed children (decoded JSON),
        a ``RefDict`` (docs/howto/read-flows.md#job-references). With ``count``, one
        ``Page`` instead: the children ``cursor`` .. ``cursor + count - 1`` in
        the order they were added, ``items`` holding those of them that are
        processed (docs/howto/read-flows.md#paged-reads). Raises ``JobNotFound``,
        ``ValueError`` for a bad name, cursor or count."""
        keys = JobKeys.of(self._require(queue, job_id))
        if count is None:
            return self.wire.ref_dict(self.client.hgetall(keys.processed), json.loads)
        return self._hash_page(queue, keys, keys.processed, cursor, count, json.loads)

    @reports_redis_down
    def child_results(self, queue: str, job_id: str) -> list:
        """Every child's result (decoded JSON) in the order the children
        were added, ``None`` for a child that did not complete (ignored,
        removed, still waiting): what a chord's callback reads
        (docs/howto/canvas.md#how-a-handler-reads-its-inputs). Reads
        ``PAGE_MAX`` children a round trip. Raises ``JobNotFound``,
        ``ValueError`` for a bad name."""
        keys = JobKeys.of(self._require(queue, job_id))
        out: list = []
        cursor = 0
        while True:
            refs, _, cursor = self._window(queue, keys, cursor, PAGE_MAX)
            values = self.client.hmget(keys.processed, refs) if refs else []
            out += [None if v is None else json.loads(v) for v in values]
            if not cursor:
                return out

    @reports_redis_down
    def ignored_failures(
        self, queue: str, job_id: str, cursor: int = 0, count: int | None = None
    ) -> RefDict | Page[RefDict]:
        """``{JobRef: error}`` for dead children ignored by policy ``id``
        (or ``cp``), a ``RefDict``; with ``count``, one ``Page`` as
        ``children_values``. Raises ``JobNotFound``, ``ValueError``."""
        keys = JobKeys.of(self._require(queue, job_id))
        if count is None:
            return self.wire.ref_dict(self.client.hgetall(keys.unsuccessful), self._error)
        return self._hash_page(queue, keys, keys.unsuccessful, cursor, count, self._error)

    def _hash_page(
        self, queue: str, keys: JobKeys, name: str, cursor: int, count: int, decode
    ) -> Page:
        """A ``Page`` of the result hash ``name``: the entries of the window's
        children that it holds, values through ``decode``."""
        refs, total, nxt = self._window(queue, keys, cursor, count)
        values = self.client.hmget(name, refs) if refs else []
        found = {r: v for r, v in zip(refs, values, strict=True) if v is not None}
        return Page(self.wire.ref_dict(found, decode), nxt, total)

    @reports_redis_down
    def dependencies(
        self, queue: str, job_id: str, cursor: int = 0, count: int | None = None
    ) -> Dependencies | Page[Dependencies]:
        """The parent's ``Dependencies``, every child a ``JobRef``; empty
        for a job that is not a parent. With ``count``, one ``Page`` whose
        ``items`` is the ``Dependencies`` of the children ``cursor`` ..
        ``cursor + count - 1`` only (``remaining`` is still the parent's
        counter): each child is on exactly one page, under one of processed,
        failed, ignored, removed or unprocessed (docs/howto/read-flows.md#paged-reads).
        Raises ``JobNotFound``, ``ValueError`` for a bad name, cursor or
        count."""
        keys = JobKeys.of(self._require(queue, job_id))
        hashes = (keys.processed, keys.failed, keys.unsuccessful, keys.removed)
        pipe = self.client.pipeline(transaction=False)
        if count is None:
            for part in hashes:
                pipe.hgetall(part)
            pipe.lrange(keys.children, 0, -1)
            pipe.get(keys.dependencies)
            processed, failed, ignored, removed, children, remaining = pipe.execute()
            children = self.keys.child_keys(queue, job_id, children)
        else:
            children, total, nxt = self._window(queue, keys, cursor, count)
            for part in hashes if children else ():
                pipe.hmget(part, children)
            pipe.get(keys.dependencies)
            *found, remaining = pipe.execute()
            processed, failed, ignored, removed = (
                [
                    {r: v for r, v in zip(children, values, strict=True) if v is not None}
                    for values in found
                ]
                if children
                else [{}, {}, {}, {}]
            )
        wire = self.wire
        deps = Dependencies(
            processed=wire.ref_dict(processed, json.loads),
            failed=wire.ref_dict(failed, self._error),
            ignored=wire.ref_dict(ignored, self._error),
            removed=wire.ref_dict(removed, self._error),
            remaining=int(remaining or 0),
        )
        resolved = {to_text(r) for part in (processed, failed, ignored, removed) for r in part}
        waiting = [r for r in children if r not in resolved]
        deps.unprocessed = wire.ref_list(waiting)
        if count is None:
            deps.unprocessed.sort()
            return deps
        return Page(deps, nxt, total)

    def _error(self, value) -> str | None:
        """A child's error as the public API shows it: child keys in a
        ``failed by child`` chain written ``queue/id``."""
        return self.keys.unkey(to_text(value))

    def _window(self, queue: str, keys: JobKeys, cursor: int, count: int) -> tuple[list, int, int]:
        """The child refs (full job keys) ``cursor`` .. ``cursor + count - 1`` of a
        parent's ``:children`` list, its length and the next cursor (0 at the
        end). The list only grows (``enqueue_flow`` appends), so a position
        is an exact cursor: unlike HSCAN over the result hashes it never
        repeats an entry and always honours ``count``
        (docs/howto/read-flows.md#paged-reads)."""
        whole_number("cursor", cursor, 0)
        whole_number("count", count, 1)
        if count > PAGE_MAX:
            raise ValueError(f"count must be at most {PAGE_MAX} children a page, got {count}")
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(keys.children, cursor, cursor + count - 1)
        pipe.llen(keys.children)
        pipe.hget(keys.row, KIDS)
        refs, total, counted = pipe.execute()
        job_id = keys.row.rpartition(":")[2]  # an id holds no ':'
        refs = self._kids(queue, job_id, refs, counted, (cursor, cursor + count - 1))
        total = total if counted is None else int(counted)
        end = cursor + len(refs)
        return refs, total, end if refs and end < total else 0

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
        pipe.hget(keys.row, KIDS)  # the count of a list holding ranges
        processed, failed, ignored, removed, children, remaining, counted = pipe.execute()
        children = children if counted is None else int(counted)
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
        policy, remaining, children: [...]}`` (``ref`` a ``JobRef``; a child's
        key in an error written ``queue/id``), children sorted by ref, down to ``depth`` levels
        (None = all; 0: the job; else ``ValueError``, before any read); a level per round trip."""
        whole_number("depth", depth, 0, optional=True)
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
        ``total``, the node's whole child count, and ``created_at`` /
        ``started_at`` (its last attempt) / ``finished_at`` (ms since the
        epoch, or None). Reads one level per round trip, at most ``count *
        (1 + fanout + ...)`` rows."""
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
                pipe.hmget(keys.row, *_ASK[paged])
                pipe.lrange(keys.children, *window(node is root))
                pipe.llen(keys.children)
                pipe.get(keys.dependencies)
                pipe.hget(keys.row, KIDS)
            replies = pipe.execute()
            next_level = []
            for i, node in enumerate(level):
                values, kids, total, remaining, counted = replies[5 * i : 5 * i + 5]
                values = pick_fields(_PAGE_FIELDS if paged else _TREE_FIELDS, values)
                name, state, result, error, policy, pieces = values[:6]
                if pieces is not None:  # a long error, kept in pieces (jobs.row_error)
                    fields = [f"error.{n}" for n in range(2, int(pieces) + 1)]
                    row = self.keys.job(node["queue"], node["id"])
                    rest = dict(zip(fields, self.client.hmget(row, fields), strict=True))
                    error = row_error({"error": error, "error.n": pieces, **rest})
                node.update(
                    ref=JobRef(node["queue"], node["id"]),
                    name=to_text(name),
                    # a row added as pending holds no state; one gone holds nothing
                    state=to_text(state) or (PENDING if name is not None else None),
                    result=json.loads(result) if result else None,
                    error=self._error(error),
                    policy=decode_policy(policy, node is not root),
                    remaining=int(remaining) if remaining is not None else None,
                    children=[],
                )
                if paged:
                    node["total"] = int(total if counted is None else counted)
                    values[6] = created_of(values[6], values[9])  # core.rows.created_of
                    node.update(zip(_TIMES, (v and int(v) for v in values[6:9]), strict=True))
                if depth is None or d < depth:
                    low_high = window(node is root)
                    found = self._kids(node["queue"], node["id"], kids, counted, low_high)
                    refs = [self.wire.ref(k) for k in found]
                    for cq, cid in refs if paged else sorted(refs):
                        child = {"queue": cq, "id": cid}
                        node["children"].append(child)
                        next_level.append(child)
            level, d = next_level, d + 1
        return root

    def _kids(self, queue: str, job_id: str, kids: list, counted, window: tuple[int, int]):
        """The child refs (full job keys) in ``window`` (``LRANGE`` bounds) of
        parent ``queue``/``job_id``'s ``:children``, given the entries that
        ``LRANGE`` read: a list holding ranges (``counted``, its row's ``cn``)
        counts its window in children, so it is read whole unless the window
        starts at 0 (as many entries hold as many children or more)
        (docs/explanation/protocol.md#ranges-of-children)."""
        if counted is None:
            return self.keys.child_keys(queue, job_id, kids)
        low, high = window
        if low:
            kids = self.client.lrange(self.keys.job_keys(queue, job_id).children, 0, -1)
        return self.keys.child_keys(queue, job_id, kids)[low : high + 1 or None]

    @reports_redis_down
    def counts(self, queue: str) -> dict[str, int]:
        """Jobs per state index, plus ``outbox`` and ``deadletter`` lengths."""
        pipe = self.client.pipeline(transaction=False)
        count_commands(pipe, self.keys.queue(queue))
        return count_replies(pipe.execute())

    @reports_redis_down
    def job_ids(
        self, queue: str, state: JobState | str, start: int = 0, end: int = -1
    ) -> list[str]:
        """Ids in one state index, oldest first (pending: the order claims
        take them, priorities included, docs/explanation/protocol.md#scheduling;
        then each group's, by group name, docs/explanation/protocol.md#groups;
        a range entry of the list read as its ids,
        docs/explanation/protocol.md#ranges-in-pending). ``start``/``end``:
        ``LRANGE``-style bounds in ids, both included."""
        k = self.keys.queue(queue)
        key = k.index(JobState(state))
        if JobState(state) is JobState.PENDING:
            ranked, stop = k.prioritized, None if end == -1 else end + 1
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(ranked, k.groups_known)
            pipe.exists(k.pending_ranged)
            sorted_too, ranged = pipe.execute()
            if not sorted_too and not ranged:
                return [to_text(v) for v in self.client.lrange(key, start, end)]
            if not sorted_too:  # an entry stands for one id or more: entries 0..end cover them
                read = end if start >= 0 and end >= 0 else -1
                return pending_ids(self.client.lrange(key, 0, read))[start:stop]
            groups = sorted(to_text(g) for g in self.client.smembers(k.groups_known))
            pipe = self.client.pipeline(transaction=False)
            parts = [(ranked, key)]
            parts += [(k.group(g, "prioritized"), k.group(g, "pending")) for g in groups]
            for zset, plain in parts:
                pipe.zrange(zset, "-inf", "(0", byscore=True)  # priorities above 0
                pipe.lrange(plain, 0, -1)  # priority 0
                pipe.zrange(zset, 0, "+inf", byscore=True)  # priorities below 0
            # a range entry stands for its ids (docs/explanation/protocol.md#ranges-in-pending)
            ids = [i for part in pipe.execute() for i in pending_ids(part)]
            return ids[start:stop]
        return [to_text(v) for v in self.client.zrange(key, start, end)]

    @reports_redis_down
    def state_of(self, queue: str, job_id: str) -> JobState | None:
        """A job's state, one field read (None: no such job)."""
        value = row_state(self.client.hmget(self.keys.job(queue, job_id), *STATE_FIELDS))
        return None if value is None else JobState(to_text(value))

    @reports_redis_down
    def is_paused(self, queue: str) -> bool:
        """True while ``queue`` is paused (one EXISTS; for stats and the admin)."""
        return bool(self.client.exists(self.keys.queue(queue).paused))
