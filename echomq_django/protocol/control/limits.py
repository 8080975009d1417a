"""``mq.limits``: what holds a queue's claims back at run time, its
concurrency cap (docs/explanation/protocol.md#concurrency) and its pause
(``lua/set_paused.lua``; docs/howto/priorities-rate-limits.md#pausing-a-queue).

``EchoMQ.claim``'s script reads the cap from ``P:{q}:concurrency`` when it is
set, else from the queue's ``CONCURRENCY`` setting, and counts the queue's
active jobs (``P:{q}:active``) against it in the same call. Setting the cap
here is one string; it also drops the full mark and wakes the queue's
workers, which blocked while the cap was reached: one pipeline of plain
commands on the queue's slot.
"""

from __future__ import annotations

from ...core.keyspace import validate_queue
from ...core.options import check_concurrency
from ..timers import WAKE_NOW
from ..wire import Part


class Limits(Part):
    """The concurrency cap and the pause of each queue, set at run time."""

    def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause (``paused`` True) or resume ``queue`` (``EchoMQ.pause`` /
        ``resume``); True when that changed its state. Raises ``ValueError``
        for a bad queue name, ``RedisUnavailable``."""
        k = self.keys.queue(validate_queue(queue))
        flag = "1" if paused else "0"
        return bool(
            self.scripts.run("set_paused", [k.paused, k.events], [flag, self.clock(), k.base])
        )

    def set_concurrency(self, queue: str, n: int | None) -> None:
        """At most ``n`` (int, 1-1,000,000 jobs) of ``queue`` active at once
        across all workers, from the next claim on; ``None`` drops the
        run-time cap (the queue's ``CONCURRENCY`` setting applies again, or
        none). Jobs already active above a lowered cap run on; no new one
        starts until the count is below it. Wakes the queue's idle workers
        (a raised cap makes room). Raises ``ValueError`` for a bad queue
        name or ``n`` (nothing written), ``RedisUnavailable``.
        docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
        validate_queue(queue)
        if n is not None:
            check_concurrency(
                n, "None drops the run-time cap: the CONCURRENCY setting applies again"
            )
        k = self.keys.queue(queue)
        self.wire.note_queues((queue,))
        pipe = self.client.pipeline(transaction=False)
        if n is None:
            pipe.delete(k.concurrency)
        else:
            pipe.set(k.concurrency, n)
        # a worker that wakes to a still-full queue is told so by claim, which
        # takes the marker back: one claim per change, never a spin
        pipe.delete(k.full)
        pipe.zadd(k.wake, {WAKE_NOW: 0})
        pipe.execute()

    def concurrency(self, queue: str) -> int | None:
        """The cap ``claim`` applies to ``queue`` now (jobs): the run-time one
        when set, else the ``CONCURRENCY`` setting; None when there is none.
        Raises ``ValueError`` for a bad queue name, ``RedisUnavailable``.
        docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
        validate_queue(queue)
        stored = self.client.get(self.keys.queue(queue).concurrency)
        if stored is not None:
            return int(stored)
        return self.wire.queues.get(queue, {}).get("CONCURRENCY")
