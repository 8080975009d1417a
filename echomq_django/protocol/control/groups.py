"""``mq.groups``: a queue's groups (tenants) at run time
(docs/explanation/protocol.md#groups): pause and resume one group, set its
own cap, and read each group's counts.

``claim`` serves the groups with work in turn (``lua/lib/groups.lua``); a
change here goes through ``lua/set_group.lua``, which puts a group that can
give a job back in the ring and wakes the queue's workers.
"""

from __future__ import annotations

from ...core.jobs import to_text
from ...core.keyspace import validate_group, validate_queue
from ...core.options import check_concurrency, check_group_rate
from ..wire import Part

GROUPS_LISTED = 1000  # groups ``counts`` reads at most (the ones with work or paused)


class Groups(Part):
    """Pause, resume and cap one group of a queue; read its counts."""

    def _set(self, queue: str, group: str, op: str, cap: str = "") -> int:
        validate_queue(queue)
        validate_group(group)
        k = self.keys.queue(queue)
        self.wire.note_queues((queue,))
        return int(
            self.scripts.run(
                "set_group", [k.groups_paused, k.groups_concurrency], [k.base, group, op, cap]
            )
        )

    def pause(self, queue: str, group: str) -> bool:
        """Stop claims of ``group``'s jobs on ``queue`` (adds go on; its
        active jobs run on). True when it changed, False when it was paused
        already. Raises ``ValueError`` for a bad queue or group name
        (nothing written), ``RedisUnavailable``.
        docs/howto/fair-queues.md#pausing-one-customer"""
        return self._set(queue, group, "pause") == 1

    def resume(self, queue: str, group: str) -> bool:
        """Claims of ``group``'s jobs go on; the queue's workers are woken.
        True when it changed, False when it was not paused. Raises
        ``ValueError`` for a bad queue or group name, ``RedisUnavailable``.
        docs/howto/fair-queues.md#pausing-one-customer"""
        return self._set(queue, group, "resume") == 1

    def set_concurrency(self, queue: str, group: str, n: int | None) -> None:
        """At most ``n`` (int, 1-1,000,000 jobs) of ``group``'s jobs on
        ``queue`` active at once, from the next claim on; None drops the
        group's own cap (the queue's ``GROUP_CONCURRENCY`` applies again, or
        none). Raises ``ValueError`` for a bad queue or group name or ``n``
        (nothing written), ``RedisUnavailable``.
        docs/howto/fair-queues.md#a-bigger-share-for-one-customer"""
        validate_group(group)
        if n is not None:
            check_concurrency(
                n, "None drops the group's cap: the queue's GROUP_CONCURRENCY applies"
            )
        self._set(queue, group, "cap", "" if n is None else str(n))

    def set_rate_limit(self, queue: str, group: str, limit: dict | None) -> None:
        """At most ``limit["MAX"]`` of ``group``'s jobs on ``queue`` started
        per fixed window of ``limit["PER_MS"]`` ms (whole numbers >= 1), from
        the next claim on; None drops the group's own (``GROUP_RATE_LIMIT``
        applies again, or none). Raises ``ValueError`` for a bad name or
        limit (nothing written), ``RedisUnavailable``.
        docs/howto/fair-queues.md#a-rate-limit-per-customer"""
        validate_group(group)
        self._set(queue, group, "rate", "" if limit is None else check_group_rate(limit))

    def concurrency(self, queue: str, group: str) -> int | None:
        """The cap ``claim`` applies to ``group`` of ``queue`` now (jobs): its
        own when set, else ``GROUP_CONCURRENCY``; None when there is none.
        Raises ``ValueError`` for a bad name, ``RedisUnavailable``."""
        validate_queue(queue)
        validate_group(group)
        stored = self.client.hget(self.keys.queue(queue).groups_concurrency, group)
        if stored is not None:
            return int(stored)
        return self.wire.group_cap(queue) or None

    def counts(self, queue: str) -> dict[str, dict]:
        """Each group of ``queue`` with claimable or active jobs, or paused:
        ``{group: {"pending": n, "active": n, "paused": bool, "concurrency":
        cap or None}}`` (at most ``GROUPS_LISTED`` groups, by name). Read
        only. Raises ``ValueError`` for a bad queue name, ``RedisUnavailable``.
        docs/reference/stats.md#groups"""
        return self.counts_many([queue])[queue]

    def counts_many(self, queues) -> dict[str, dict[str, dict]]:
        """``counts`` of each of ``queues`` (names), ``{queue: {group:
        ...}}``, in two round trips whatever their number (one when no
        queue has groups). Raises ``ValueError`` for a bad queue name,
        ``RedisUnavailable``."""
        names = [validate_queue(q) for q in queues]
        pipe = self.client.pipeline(transaction=False)
        for q in names:
            k = self.keys.queue(q)
            pipe.smembers(k.groups_known)
            pipe.smembers(k.groups_paused)
            pipe.hgetall(k.groups_active)
            pipe.hgetall(k.groups_concurrency)
        replies = iter(pipe.execute())
        seen = {}
        for q in names:
            known, paused, active, caps = (next(replies) for _ in range(4))
            paused = {to_text(g) for g in paused}
            groups = sorted({to_text(g) for g in known} | paused)[:GROUPS_LISTED]
            active = {to_text(g): int(n) for g, n in active.items()}
            caps = {to_text(g): int(n) for g, n in caps.items()}
            seen[q] = (groups, paused, active, caps)
        out: dict[str, dict[str, dict]] = {q: {} for q in names}
        if not any(groups for groups, *_ in seen.values()):
            return out  # no queue with groups: one round trip
        pipe = self.client.pipeline(transaction=False)
        for q, (groups, *_) in seen.items():
            k = self.keys.queue(q)
            for g in groups:
                pipe.llen(k.group(g, "pending"))
                pipe.zcard(k.group(g, "prioritized"))
        sizes = iter(pipe.execute())
        for q, (groups, paused, active, caps) in seen.items():
            default = self.wire.group_cap(q) or None if groups else None
            for g in groups:
                out[q][g] = {
                    "pending": next(sizes) + next(sizes),
                    "active": active.get(g, 0),
                    "paused": g in paused,
                    "concurrency": caps.get(g, default),
                }
        return out
