"""Waiting out a Redis outage, one way for every runner (docs/explanation/reliability.md).

The worker's claiming loop, its reporter thread and the pump each hold an
``Outage``: a failed try is logged at WARNING with the wait before the next
("Redis unreachable at ..., retrying in Xs") up to the first at the cap, then
one line per ``SAY_EVERY_S`` while it lasts; the wait doubles from ``BACKOFF_START_S`` to
``BACKOFF_MAX_S`` (2 s: Redis is heard within 2 s of its return), and the
recovery is logged once,
only after a call that reached Redis. ``wait_until_reachable`` is the same
wait before a runner starts: ``runworker`` and ``runpump`` started before
Redis come up with it, and ``StartSignals`` keeps a SIGTERM sent while they
start.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..conf import check_server, config, get_mq, offline_mq
from ..core.exceptions import RedisUnavailable
from ..protocol.connection import redacted
from ..protocol.errors import describe

# A runner's tries while Redis is away: 0.5 s, 1 s, then every 2 s, so a
# Redis that comes back is heard within 2 s (ioredis's 2 s cap); the log
# says each try up to the first at the cap, then at most one line per SAY_EVERY_S.
BACKOFF_START_S, BACKOFF_MAX_S, SAY_EVERY_S = 0.5, 2.0, 30.0

# What "Redis is down" looks like to a runner: every part of EchoMQ turns a
# dropped connection, CLUSTERDOWN, TRYAGAIN, READONLY, LOADING... into this.
REDIS_DOWN = (RedisUnavailable,)


class Outage:
    """One thread's view of a Redis outage on ``client``, logged to ``log``."""

    def __init__(self, client, log: logging.Logger, where: str | None = None) -> None:
        self.where, self.log, self.max_s = where or describe(client), log, BACKOFF_MAX_S
        self.delay, self.down, self.since, self.said = BACKOFF_START_S, False, 0.0, 0.0
        self.capped = False  # a try at the cap was logged: the rest go by SAY_EVERY_S

    def failed(self, err: BaseException) -> float:
        """Log the failure (each try up to the first at the cap, then at most
        one line per ``SAY_EVERY_S``: how long it has lasted); returns the
        seconds to wait before the next try."""
        delay, now = self.delay, time.monotonic()
        if not self.down:
            self.down, self.since = True, now
        if not self.capped:
            self.capped, self.said = delay >= self.max_s, now
            self.log.warning(
                "Redis unreachable at %s (%s), retrying in %.1fs", self.where, cause(err), delay
            )
        elif now - self.said >= SAY_EVERY_S:
            self.said = now
            self.log.warning(
                "Redis still unreachable at %s after %.0fs (%s), retrying every %.1fs",
                *(self.where, now - self.since, cause(err), self.max_s),
            )
        self.delay = min(delay * 2, self.max_s)
        return delay

    def ok(self) -> None:
        """Redis answered: log the recovery (once) and reset the backoff."""
        if self.down:
            self.log.warning("Redis reachable again at %s", self.where)
        self.delay, self.down, self.capped = BACKOFF_START_S, False, False


def cause(err: BaseException) -> str:
    """The driver's own words for a connection error (``RedisUnavailable``
    wraps them with the address, which the log line gives already)."""
    if isinstance(err, RedisUnavailable) and err.__cause__ is not None:
        err = err.__cause__
    return first_line(err)


def first_line(value) -> str:
    """The first line of ``str(value)``."""
    return str(value).split("\n", 1)[0]


T = TypeVar("T")


def wait_until_reachable(
    connect: Callable[[], T], log: logging.Logger, stop: threading.Event, where: str
) -> T | None:
    """Call ``connect()`` until it returns, and return what it returned. Each
    ``RedisUnavailable`` it raises is logged as an outage (the wait doubling
    from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S`` s; a WARNING per try up to
    the first at the cap, then one per ``SAY_EVERY_S``) and waited out; the
    first success after a failure logs one recovery line. ``where`` names
    the server in those lines (a URL). Returns None as soon as ``stop`` is
    set (a SIGTERM while waiting). Any other error ``connect()`` raises
    propagates."""
    outage = Outage(None, log, where=where)
    while not stop.is_set():
        try:
            value = connect()
        except RedisUnavailable as err:
            stop.wait(outage.failed(err))
            continue
        outage.ok()
        return value
    return None


def reach_redis_at_start(wait: bool, log: logging.Logger, stop: threading.Event):
    """What ``runworker`` and ``runpump`` do before they start: build the
    process's ``EchoMQ`` (``conf.get_mq``), PING Redis, and check the server
    is what the settings say (``conf.check_server``). With ``wait`` (a
    long-running command), a Redis that does not answer yet is waited for
    (``wait_until_reachable``: the wait doubling to ``BACKOFF_MAX_S`` s, a
    WARNING per try up to the first at the cap and every ``SAY_EVERY_S``
    after, one line when it answers), so a runner started
    before Redis comes up with it. ``stop`` is set by a SIGTERM or SIGINT
    (``StartSignals.stopped``): set at any point before this returns, even
    during a try that reached Redis, it makes this return None (a clean
    stop). Without ``wait`` (``--burst``, ``--once``, ``--no-wait``) it
    raises ``RedisUnavailable`` at once. Returns the ``EchoMQ``. Raises
    ``ImproperlyConfigured`` for bad settings or a server that is not what
    they say (``conf.check_server``: CLUSTER on a plain server or the other
    way round, a DB index out of range, refused credentials), at once and
    with ``wait`` too: waiting would not mend them.
    docs/howto/deploy.md#start-order-when-redis-boots-last"""

    def connect():
        offline_mq()  # the settings' own problems first (ImproperlyConfigured), no I/O
        # then what the server says, before a client connects: a DB index out of range
        # fails PING as a refusal, a Cluster client fails on a plain server as if it
        # were down, a refused password too; each is a setting to fix, not an outage
        check_server()
        mq = get_mq()
        mq.ping()
        return mq

    if not wait:
        mq = connect()
    else:
        cfg = config()
        where = redacted(os.environ.get("ECHOMQ_URL") or cfg.get("URL"))
        if not where and cfg.get("SENTINELS"):
            where = f"master {cfg.get('MASTER_NAME')!r} of sentinels {cfg['SENTINELS']!r}"
        where = where or f"cache {cfg.get('CACHE')!r}"
        mq = wait_until_reachable(connect, log, stop, where)
    return None if stop.is_set() else mq


class StartSignals:
    """SIGTERM and SIGINT while a runner starts, never lost
    (docs/howto/deploy.md#start-order-when-redis-boots-last). Built first
    thing in a command (on the main thread; elsewhere it installs nothing):
    until ``hand_over``, a signal sets ``stopped`` and logs
    "SIGTERM while starting: stopping" once; from ``hand_over(handler)`` on,
    a signal calls ``handler(signum, frame)``, the runner's own rule. So a
    signal between the first line of a command and the runner's loop either
    stops the start or reaches the runner, whatever line it lands on.
    ``close()`` puts back the handlers it replaced (a command called
    in-process, ``call_command``, leaves its caller's as they were)."""

    def __init__(self, log: logging.Logger) -> None:
        self.stopped, self.log, self.handler = threading.Event(), log, None
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._on_signal)

    def close(self) -> None:
        """Put back the handlers this replaced."""
        for sig, handler in self.previous.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
        self.previous = {}

    def _on_signal(self, signum, frame) -> None:
        if self.handler is not None:
            self.handler(signum, frame)
        elif not self.stopped.is_set():
            self.log.warning("%s while starting: stopping", signal.Signals(signum).name)
            self.stopped.set()

    def hand_over(self, handler: Callable[[int, object], None]) -> bool:
        """Route every later signal to ``handler``; returns True when one came
        before (the runner should not start)."""
        self.handler = handler
        return self.stopped.is_set()
