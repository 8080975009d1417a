"""The read API: pure, id-checked, never writes (seed 001; STYLE rule 5).

``Reads`` is mixed into ``EchoMQ``; every method takes a queue name and a job
id, validates both, raises ``JobNotFound`` for an unknown id and answers
empty results (not an error) for a job that is not a parent.
"""

from __future__ import annotations

import json
from typing import Any

from .exceptions import JobNotFound, reports_redis_down
from .jobs import STATE_INDEX, Dependencies, Job, JobState, _text


def _texts(mapping: dict) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in mapping.items()}


class Reads:
    """Read methods of ``EchoMQ``; expects ``self.client`` and ``self.keys``.
    Every public method raises ``RedisUnavailable`` when Redis is down."""

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
            score = self.client.zscore(self.keys.queue_key(queue, "active"), job_id)
            job.lease_deadline = int(score) if score is not None else None
        return job

    @reports_redis_down
    def children_values(self, queue: str, job_id: str) -> dict[str, Any]:
        """``{child_ref: result}`` for the processed children (decoded JSON)."""
        key = self._require(queue, job_id)
        raw = self.client.hgetall(key + ":processed")
        return {_text(k): json.loads(v) for k, v in raw.items()}

    @reports_redis_down
    def ignored_failures(self, queue: str, job_id: str) -> dict[str, str]:
        """``{child_ref: error}`` for dead children ignored by policy ``id``."""
        key = self._require(queue, job_id)
        return _texts(self.client.hgetall(key + ":unsuccessful"))

    @reports_redis_down
    def dependencies(self, queue: str, job_id: str) -> Dependencies:
        """The parent's ``Dependencies``; empty for a job that is not a parent."""
        key = self._require(queue, job_id)
        pipe = self.client.pipeline(transaction=False)
        for part in ("processed", "failed", "unsuccessful", "removed"):
            pipe.hgetall(f"{key}:{part}")
        pipe.lrange(key + ":children", 0, -1)
        pipe.get(key + ":dependencies")
        processed, failed, ignored, removed, children, remaining = pipe.execute()
        deps = Dependencies(
            processed={_text(k): json.loads(v) for k, v in processed.items()},
            failed=_texts(failed),
            ignored=_texts(ignored),
            removed=_texts(removed),
            remaining=int(remaining or 0),
        )
        resolved = set(deps.processed) | set(deps.failed) | set(deps.ignored) | set(deps.removed)
        deps.unprocessed = sorted(r for r in map(_text, children) if r not in resolved)
        return deps

    @reports_redis_down
    def dependency_counts(self, queue: str, job_id: str) -> dict[str, int]:
        """Counts without the values: ``{processed, unprocessed, failed, ignored,
        removed, remaining, children}``."""
        key = self._require(queue, job_id)
        pipe = self.client.pipeline(transaction=False)
        for part in ("processed", "failed", "unsuccessful", "removed"):
            pipe.hlen(f"{key}:{part}")
        pipe.llen(key + ":children")
        pipe.get(key + ":dependencies")
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
        self._require(queue, job_id)
        root = {"queue": queue, "id": job_id}
        level, d = [root], 0
        while level:
            pipe = self.client.pipeline(transaction=False)
            for node in level:
                key = self.keys.job(node["queue"], node["id"])
                pipe.hmget(key, "name", "state", "result", "error", "parent_policy")
                pipe.lrange(key + ":children", 0, -1)
                pipe.get(key + ":dependencies")
            replies = pipe.execute()
            next_level = []
            for i, node in enumerate(level):
                (name, state, result, error, policy), kids, remaining = replies[3 * i : 3 * i + 3]
                node.update(
                    ref=self.keys.job(node["queue"], node["id"]),
                    name=_text(name),
                    state=_text(state),
                    result=json.loads(result) if result else None,
                    error=_text(error),
                    policy=_text(policy) or ("fp" if node is not root else None),
                    remaining=int(remaining) if remaining is not None else None,
                    children=[],
                )
                if depth is None or d < depth:
                    for ref in sorted(map(_text, kids)):
                        cq, cid = self.keys.parse_ref(ref)
                        child = {"queue": cq, "id": cid}
                        node["children"].append(child)
                        next_level.append(child)
            level, d = next_level, d + 1
        return root

    @reports_redis_down
    def counts(self, queue: str) -> dict[str, int]:
        """Jobs per state index, plus ``outbox`` and ``deadletter`` lengths."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(k.queue_key(queue, "pending"))
        for state in ("active", "delayed", "completed", "dead", "awaiting"):
            pipe.zcard(k.queue_key(queue, state))
        pipe.llen(k.queue_key(queue, "flow:outbox"))
        pipe.llen(k.queue_key(queue, "flow:deadletter"))
        pending, active, delayed, completed, dead, awaiting, outbox, dl = pipe.execute()
        return {
            "pending": pending,
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
        """Ids in one state index, oldest first (pending: FIFO order)."""
        key = self.keys.queue_key(queue, STATE_INDEX[JobState(state)])
        if JobState(state) is JobState.PENDING:
            return [_text(v) for v in self.client.lrange(key, start, end)]
        return [_text(v) for v in self.client.zrange(key, start, end)]

    def outbox_head(self, queue: str, count: int) -> list:
        """The first ``count`` entries of ``queue``'s outbox, raw (bytes or
        str, as the client decodes), not removed: the pump delivers them, then
        ``trim_outbox`` removes what was delivered."""
        return self.client.lrange(self.keys.queue_key(queue, "flow:outbox"), 0, count - 1)

    @reports_redis_down
    def deadletters(self, queue: str, start: int = 0, end: int = -1) -> list[dict]:
        """Dead-lettered outbox entries: ``[{entry: {...}, reason, at (ms)}]``;
        an entry that is not our JSON comes back as its raw text."""
        raw = self.client.lrange(self.keys.queue_key(queue, "flow:deadletter"), start, end)
        out = []
        for item in raw:
            try:
                d = json.loads(item)
                d["entry"] = json.loads(d["entry"])
            except (ValueError, KeyError, TypeError):  # written by hand, or garbled
                d = {"entry": _text(item), "reason": "unreadable dead-letter entry", "at": None}
            out.append(d)
        return out
