"""Scheduling and flow-control calls of ``EchoMQ`` (DESIGN §10.3): pause /
resume, ``remove_child_dependency``, ``remove_unprocessed_children``, the
children-timeout sweep, ``postpone`` (a rate-limited job goes back without
spending its attempt) and the periodic jobs' tick marks.

``SchedulingCalls`` is a mixin of ``EchoMQ``, as ``FlowCalls`` is: each method
runs one script of ``lua/`` and decodes its reply (the one floor that speaks
Lua, tests/test_structure.py).
"""

from __future__ import annotations

import json

from ..core.options import MAX_MS, check_int, rate_limit


class SchedulingCalls:
    """``EchoMQ`` methods of DESIGN §10.3: pause / resume, and flow control.

    Mixed into ``EchoMQ``; uses its ``keys``, ``scripts``, ``clock``,
    ``client`` and ``_outcome``.
    """

    def _limit(self, queue: str) -> tuple[int, int]:
        """``claim``'s rate-limit ARGV: the queue's RATE_LIMIT ``(max, per_ms)``."""
        return rate_limit(self.queues.get(queue, {}))

    # -- pause / resume ------------------------------------------------------
    def _set_paused(self, queue: str, paused: bool) -> bool:
        k = self.keys.queue(queue)
        return bool(
            self.scripts.run(
                "set_paused",
                [k.paused, k.events],
                ["1" if paused else "0", self.clock(), k.base],
            )
        )

    def pause(self, queue: str) -> bool:
        """Pause ``queue``: no worker claims from it until ``resume``; adds,
        completions, fan-in and the pump go on. Returns True when it was not
        paused already. Raises ``ValueError`` for a bad name. DESIGN §10.3."""
        return self._set_paused(queue, True)

    def resume(self, queue: str) -> bool:
        """Resume a paused ``queue``; True when it was paused. DESIGN §10.3."""
        return self._set_paused(queue, False)

    def is_paused(self, queue: str) -> bool:
        """True while ``queue`` is paused (one EXISTS; for stats and the admin)."""
        return bool(self.client.exists(self.keys.queue(queue).paused))

    # -- flow control --------------------------------------------------------
    def _remove_dependencies(self, queue: str, parent_id: str, refs: list[str], strict: bool):
        k = self.keys
        reply = self.scripts.run(
            "remove_child_dependency",
            [k.job(queue, parent_id)],
            [queue, k.base(queue), parent_id, self.clock(), "1" if strict else "0", *refs],
        )
        return json.loads(reply).get("removed") or [], self._outcome(reply)

    def remove_child_dependency(self, queue: str, parent_id: str, child_ref: str):
        """The parent ``queue/parent_id`` stops waiting for the child
        ``child_ref`` (its full job key, e.g. ``mq.keys.job("q", "c1")``):
        recorded in the parent's ``:removed``, counter decremented, the parent
        released at zero. The child is not touched; if it finishes later its
        fan-in changes nothing. Returns the ``Outcome`` (``released``).
        Raises ``JobNotFound`` (no parent), ``JobNotActive`` (the parent is not
        awaiting_children), ``DependencyError`` (not an unresolved child),
        ``ValueError`` (a bad name or ref). DESIGN §10.3."""
        self.keys.parse_ref(child_ref)
        return self._remove_dependencies(queue, parent_id, [child_ref], True)[1]

    def remove_unprocessed_children(self, queue: str, parent_id: str):
        """Remove the children of a held parent that have not started (pending
        or delayed), on any queue: the parent stops waiting for them first
        (so a crash halfway never leaves it waiting for ever), then each one
        is deleted on its own slot. Children that are running, held (waiting
        for children of their own) or finished are left as they are. Returns
        ``(deleted, outcome)``: the ``(queue, id)`` pairs deleted and the
        ``Outcome`` (``released`` when the parent went on). Raises
        ``JobNotFound`` / ``JobNotActive`` like ``remove_child_dependency``.
        DESIGN §10.3."""
        deps = self.dependencies(queue, parent_id)
        by_queue: dict[str, list[tuple[str, str]]] = {}
        for ref in deps.unprocessed:
            cq, cid = self.keys.parse_ref(ref)
            by_queue.setdefault(cq, []).append((ref, cid))
        states = {}
        for cq, items in by_queue.items():
            rows = [self.keys.job(cq, cid) for _, cid in items]
            pipe = self.client.pipeline(transaction=False)
            for row in rows:
                pipe.hget(row, "state")
            for (ref, _), st in zip(items, pipe.execute(), strict=True):
                states[ref] = st.decode() if isinstance(st, bytes) else st
        waiting = [ref for ref, st in states.items() if st in ("pending", "delayed")]
        removed, outcome = self._remove_dependencies(queue, parent_id, waiting, False)
        k, calls, queues = self.keys, [], []
        for cq, items in by_queue.items():
            ids = [cid for ref, cid in items if ref in removed]
            if ids:
                queues.append(cq)
                calls.append(
                    (
                        "drop_unprocessed",
                        [k.queue(cq).pending, k.queue(cq).delayed],
                        [k.base(cq), parent_id, queue, *ids],
                    )
                )
        dropped = []
        for cq, reply in zip(queues, self.scripts.run_many(calls), strict=True):
            if isinstance(reply, Exception):
                raise reply
            dropped += [(cq, i.decode() if isinstance(i, bytes) else i) for i in reply]
        return dropped, outcome

    def expire_children(self, queue: str, limit: int = 1000):
        """Kill held parents of ``queue`` whose ``children_timeout_ms`` has
        passed (error ``children timed out``; their policy applies upward).
        Returns ``(expired, outcome)``: how many parents timed out, and the
        ``Outcome`` (``dead``, ``flow_failed`` up the tree). Run by the pump. DESIGN §10.3."""
        k = self.keys
        reply = self.scripts.run(
            "expire_children",
            [k.queue(queue).deadlines],
            [queue, k.base(queue), self.clock(), limit],
        )
        return json.loads(reply).get("expired", 0), self._outcome(reply)

    def postpone(self, job, retry_after_ms: int) -> int:
        """Put an active job back without spending its attempt; it runs again
        in ``retry_after_ms`` (ms). Returns the run-at (ms). The worker calls
        it when a handler raises ``RateLimited``. Raises ``JobNotFound``,
        ``JobNotActive``, ``LeaseLost``. DESIGN §10.3."""
        check_int("retry_after_ms", retry_after_ms, 0, MAX_MS)
        q, k = job.queue, self.keys.queue(job.queue)
        return int(
            self.scripts.run(
                "postpone",
                [k.job(job.id), k.delayed, k.active],
                [q, job.id, job.lease or "", self.clock(), retry_after_ms],
            )
        )

    # -- periodic jobs (schedule.py drives these) ----------------------------
    def schedule_mark(self, queue: str, entry: str, tick: int, mode: str) -> int:
        """Move entry's last-tick mark (ms): ``mode`` 'fire' (forward only) or
        'init' (only when unset). Returns the mark. DESIGN §10.3."""
        return int(
            self.scripts.run(
                "advance_schedule", [self.keys.queue(queue).schedule(entry)], [tick, mode]
            )
        )

    def schedule_last(self, queue: str, entry: str) -> int | None:
        """The last tick (ms) periodic entry ``entry`` fired on ``queue``, or
        None before its first start (a read; for stats and the admin)."""
        raw = self.client.get(self.keys.queue(queue).schedule(entry))
        return None if raw is None else int(raw)
