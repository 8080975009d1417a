"""Waiting out a Redis outage, one way for every runner (DESIGN §8).

The worker's claiming loop, its reporter thread and the pump each hold an
``Outage``: a failed try is logged at WARNING with the wait before the next
("Redis unreachable at ..., retrying in Xs"), the wait doubles from
``BACKOFF_START_S`` to ``BACKOFF_MAX_S``, and the recovery is logged once.
"""

from __future__ import annotations

import logging

from ..core.exceptions import RedisUnavailable
from ..protocol.errors import describe

BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0

# What "Redis is down" looks like to a runner: every part of EchoMQ turns a
# dropped connection, CLUSTERDOWN, TRYAGAIN, READONLY, LOADING... into this.
REDIS_DOWN = (RedisUnavailable,)


class Outage:
    """One thread's view of a Redis outage on ``client``, logged to ``log``."""

    def __init__(self, client, log: logging.Logger) -> None:
        self.where, self.log = describe(client), log
        self.delay, self.down = BACKOFF_START_S, False

    def failed(self, err: BaseException) -> float:
        """Log the failure; returns the seconds to wait before the next try."""
        delay, self.down = self.delay, True
        self.log.warning(
            "Redis unreachable at %s (%s), retrying in %.1fs", self.where, cause(err), delay
        )
        self.delay = min(delay * 2, BACKOFF_MAX_S)
        return delay

    def ok(self) -> None:
        """Redis answered: log the recovery (once) and reset the backoff."""
        if self.down:
            self.log.warning("Redis reachable again at %s", self.where)
        self.delay, self.down = BACKOFF_START_S, False


def cause(err: BaseException) -> str:
    """The driver's own words for a connection error (``RedisUnavailable``
    wraps them with the address, which the log line gives already)."""
    if isinstance(err, RedisUnavailable) and err.__cause__ is not None:
        err = err.__cause__
    return first_line(err)


def first_line(value) -> str:
    """The first line of ``str(value)``."""
    return str(value).split("\n", 1)[0]
