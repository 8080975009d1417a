"""What an operator changes while the queues run, over the ``EchoMQ`` built
from settings (docs/explanation/house.md#the-root-djangos-conventional-files):
a queue's concurrency cap. Stored in Redis, so every worker and process
sees a change at its next claim, without a restart or a deploy.
"""

from __future__ import annotations

from .conf import get_mq


def set_concurrency(queue: str, n: int | None) -> None:
    """At most ``n`` (int, 1-1,000,000) jobs of ``queue`` active at once
    across all workers, from the next claim on; ``None`` drops the run-time
    cap, so the queue's ``CONCURRENCY`` setting applies again (or none).
    Raises ``ValueError`` for a bad queue name or ``n``, before any write;
    ``RedisUnavailable`` when Redis cannot be reached.
    docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
    get_mq().limits.set_concurrency(queue, n)


def get_concurrency(queue: str) -> int | None:
    """The concurrency cap claims of ``queue`` apply now (jobs): the run-time
    one when set, else the ``CONCURRENCY`` setting; None when there is none.
    Raises ``ValueError`` for a bad queue name, ``RedisUnavailable``.
    docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
    return get_mq().limits.concurrency(queue)
