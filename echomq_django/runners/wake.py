"""Blocking instead of polling: the wake-ups and the timers a runner keeps
(DESIGN §10.1, issue 12).

Every script that makes a job claimable wakes its queue on the queue's own
slot (``lua/lib/claimable.lua``): ``P:{q}:wake`` holds ``'0'`` while a job is
claimable and no worker was told, and ``'d'`` scored with the earliest
delayed run-at announced; ``P:{q}:flow:wake`` holds ``'0'`` while the outbox
has entries for the pump. Both are sorted sets of at most two members.

* ``Waker`` blocks on one of those keys per queue (``BZPOPMIN``, with a
  timeout) and posts each marker it pops to its runner as a ``Wake``. On one
  server a single thread blocks on every queue's key in one command; on a
  Redis Cluster one thread per queue blocks on that queue's key, routed to
  the node of its slot (a blocking command over two slots would be refused).
  It blocks only while armed: the runner arms it when it could use a wake-up
  (a free thread and every queue drained), and each pop disarms it, so a busy
  worker leaves the markers to idle ones; a marker its runner cannot use after
  all (busy again, stopping) goes back with ``put_back``. A dropped connection
  (Redis restart, failover) is retried with backoff; the runner gets
  ``DOWN`` then ``UP`` and claims every queue once it is back, so
  nothing claimable while it was away waits for a wake-up.
* ``Timers``: the timers a worker keeps for its queues, so ``runworker``
  alone runs a site: it promotes due delayed jobs at their run-at (learnt
  from ``'d'`` markers and from its sweeps), and every ``sweep_s`` seconds
  the first worker of a queue to take the queue's short lock
  (``P:{q}:timers:lock``, it expires, never released: at most one sweep per
  queue per interval however many workers run) recovers expired leases,
  reads the next delayed run-at, and re-wakes a queue that has pending jobs
  (a marker lost with a killed worker costs at most one interval).

Both threads' Redis commands are counted for an idle worker: one
``BZPOPMIN`` per ``block_s`` per blocking connection, and per queue one
``SET NX`` per ``sweep_s`` plus three reads for the worker holding the lock.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from ..core.jobs import Outcome
from ..protocol.scripts import socket_timeout

log = logging.getLogger("echomq_django.wake")

WAKE_NOW, WAKE_DUE = "0", "d"  # the members lua/lib/claimable.lua writes
BLOCK_S = 4.0  # longest single BZPOPMIN (s): bounds a lost reply's cost, not latency
SWEEP_S = 10.0  # a queue's sweep interval (s): lease recovery, next run-at, lost markers
SOCKET_MARGIN_S = 1.0  # a blocking read waits this much longer than its command
BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


@dataclass(frozen=True)
class Wake:
    """What a ``Waker`` posts: a popped marker (``queue``, ``member`` ``'0'``
    or ``'d'``, ``score``: 0, or the run-at in ms), or the connection's state
    (``DOWN``, ``UP``: queue ``''``)."""

    queue: str
    member: str
    score: int = 0


DOWN, UP = Wake("", "down"), Wake("", "up")


class Waker:
    """Blocks on ``key`` (the ``QueueKeys`` field ``"wake"`` or
    ``"outbox_wake"``) of each of ``queues`` and calls ``post(Wake)`` for each
    marker popped (see the module).

    ``mq``: an ``EchoMQ``; ``block_s`` (s): longest single blocking command
    (bounded below the client's socket timeout); ``name``: thread name.
    ``start()``, ``arm()`` (block for the next wake-up), ``disarm()``,
    ``put_back(wake)``, ``stop()``. Thread-safe; ``post`` runs on a waker
    thread and must not block.
    """

    def __init__(
        self, mq, queues, key: str, post, *, block_s: float = BLOCK_S, name="echomq-waker"
    ):
        self.mq, self.key, self.post, self.name = mq, key, post, name
        self.queues = list(queues)
        self._armed = threading.Event()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        cluster = isinstance(mq.client, RedisCluster)
        self._own = None if cluster else _private_client(mq.client, block_s)
        self.client = self._own or mq.client
        timeout = socket_timeout(mq.client) if self._own is None else None
        self.block_s = max(0.1, min(block_s, timeout - SOCKET_MARGIN_S)) if timeout else block_s
        # one blocking command per slot: every queue at once on one server
        self.groups = [[q] for q in self.queues] if cluster else [self.queues]

    def start(self) -> None:
        for i, group in enumerate(self.groups):
            thread = threading.Thread(
                target=self._run, args=(group,), daemon=True, name=f"{self.name}-{i}"
            )
            thread.start()
            self._threads.append(thread)

    def arm(self) -> None:
        """Block for the next wake-up (a no-op while armed)."""
        self._armed.set()

    def disarm(self) -> None:
        """Leave markers to others (a command already blocked may still pop one)."""
        self._armed.clear()

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def stop(self) -> None:
        """Stop blocking. A thread blocked in Redis is cut off (one server) or
        returns within ``block_s`` (Cluster); whatever it pops after this goes
        back."""
        self._halt.set()
        self._armed.set()
        if self._own is not None:
            self._own.connection_pool.disconnect()

    def put_back(self, wake: Wake) -> None:
        """Return a popped marker for another runner (``'d'`` keeps the
        earliest run-at). Errors are logged, not raised: at worst a sweep
        re-wakes the queue."""
        key = getattr(self.mq.keys.queue(wake.queue), self.key)
        try:
            if wake.member == WAKE_DUE:
                self.mq.client.zadd(key, {WAKE_DUE: wake.score}, lt=True)
            else:
                self.mq.client.zadd(key, {wake.member: wake.score})
        except Exception as err:  # also a connection cut off under us by stop()
            log.debug("putting back %s on %s failed: %s", wake.member, key, err)

    def _run(self, queues: list[str]) -> None:
        keys = {getattr(self.mq.keys.queue(q), self.key): q for q in queues}
        order, turn, down, delay = list(keys), 0, False, BACKOFF_START_S
        while not self._halt.is_set():
            self._armed.wait()
            if self._halt.is_set():
                return
            turn = (turn + 1) % len(order)  # rotate: one busy queue cannot starve the rest
            try:
                got = self.client.bzpopmin(order[turn:] + order[:turn], timeout=self.block_s)
            except Exception as err:  # cut off by stop(), or Redis went away
                if self._halt.is_set():
                    return
                if not isinstance(err, (*REDIS_DOWN, redis.exceptions.ClusterError)):
                    log.exception("%s: blocking on %s failed", self.name, self.key)
                if not down:
                    down = True
                    log.warning(
                        "%s: blocking on %s failed (%s); retrying", self.name, self.key, err
                    )
                    self.post(DOWN)
                self._halt.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            if down:
                down, delay = False, BACKOFF_START_S
                self.post(UP)
            if not got:
                continue
            key, member, score = got
            wake = Wake(keys[_text(key)], _text(member), int(score))
            if self._halt.is_set():
                self.put_back(wake)
                return
            self._armed.clear()
            self.post(wake)


class Timers:
    """A worker's timers for ``queues`` (see the module): ``learn(queue,
    run_at_ms)`` a delayed run-at; ``next_in()`` seconds until the next timer;
    ``run()`` fires what is due and returns the merged ``Outcome`` (recovered
    jobs that died and what that moved; their signals are durable events).

    ``sweep_s`` (s): sweep interval per queue; ``max_stalls``: lease expiries a
    job survives (as the pump's); ``limit``: most jobs moved per script call.
    Redis errors propagate (the worker waits an outage out).
    """

    def __init__(self, mq, queues, *, sweep_s: float = SWEEP_S, max_stalls: int = 1, limit=1000):
        if sweep_s <= 0:
            raise ValueError(f"sweep_s must be > 0 s, got {sweep_s!r}")
        self.mq, self.queues = mq, list(queues)
        self.sweep_s, self.max_stalls, self.limit = float(sweep_s), max_stalls, limit
        self.due: dict[str, int | None] = dict.fromkeys(self.queues)  # earliest run-at (ms)
        self.sweep_at = dict.fromkeys(self.queues, 0.0)  # monotonic time of the next sweep
        self.token = secrets.token_hex(8)
        self.promoted = self.recovered = self.sweeps = 0

    def learn(self, queue: str, run_at: int) -> None:
        if queue in self.due and (self.due[queue] is None or run_at < self.due[queue]):
            self.due[queue] = int(run_at)

    def wake_all(self) -> None:
        """Every timer is due now (after a reconnect)."""
        for queue in self.queues:
            self.sweep_at[queue] = 0.0

    def next_in(self) -> float:
        """Seconds until the next timer is due (0 when one is)."""
        now, ms = time.monotonic(), self.mq.clock()
        waits = [at - now for at in self.sweep_at.values()]
        waits += [(due - ms) / 1000 for due in self.due.values() if due is not None]
        return max(0.0, min(waits))

    def run(self) -> Outcome:
        outcome = Outcome()
        now = time.monotonic()
        for queue in self.queues:
            due = self.due[queue]
            if due is not None and due <= self.mq.clock():
                self._promote(queue)
            if self.sweep_at[queue] <= now:
                self._sweep(queue, outcome)
        return outcome

    def _promote(self, queue: str) -> None:
        moved = self.mq.promote_delayed(queue, limit=self.limit)
        self.promoted += moved
        if moved >= self.limit:
            return  # more are due: promote again on the next pass
        self.due[queue] = self._next_run_at(queue)

    def _next_run_at(self, queue: str) -> int | None:
        head = self.mq.client.zrange(self.mq.keys.queue(queue).delayed, 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def _sweep(self, queue: str, outcome: Outcome) -> None:
        k, client = self.mq.keys.queue(queue), self.mq.client
        self.sweep_at[queue] = time.monotonic() + self.sweep_s
        lock = k.timers_lock
        if not client.set(lock, self.token, nx=True, px=int(self.sweep_s * 1000)):
            return  # another worker swept this queue within the interval
        self.sweeps += 1
        pipe = client.pipeline(transaction=False)
        pipe.zrange(k.delayed, 0, 0, withscores=True)
        pipe.zrange(k.active, 0, 0, withscores=True)
        pipe.exists(k.pending, k.prioritized)  # claimable, priorities included (DESIGN §10.3)
        delayed, active, pending = pipe.execute()
        now = self.mq.clock()
        self.due[queue] = int(delayed[0][1]) if delayed else None
        if self.due[queue] is not None and self.due[queue] <= now:
            self._promote(queue)
        if active and active[0][1] < now:
            stalled = self.mq.recover_stalled(queue, limit=self.limit, max_stalls=self.max_stalls)
            self.recovered += stalled.recovered
            outcome.merge(stalled)
        if pending:
            client.zadd(k.wake, {WAKE_NOW: 0})  # a marker may have been lost
        # retention, queued removals and cancels (DESIGN §10.2), bounded per sweep
        outcome.merge(self.mq.prune(queue).outcome)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_POOL_KWARGS_DROPPED = ("orig_", "maint_notifications", "himport")


def _private_client(client, block_s: float) -> redis.Redis | None:
    """A client on a pool of its own, for one server: a blocked command can
    be cut off at stop, and its socket outlives the command by
    ``SOCKET_MARGIN_S`` whatever the shared client's timeout. None when the
    pool is not a plain one (Sentinel...): the shared client is used then."""
    pool = getattr(client, "connection_pool", None)
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return None
    kwargs = {
        k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_KWARGS_DROPPED)
    }
    kwargs["socket_timeout"] = block_s + SOCKET_MARGIN_S
    kwargs.pop("retry", None)  # a blocking command is never re-sent: it may have popped
    try:
        private = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    except TypeError:
        return None
    return redis.Redis(connection_pool=private)


class Idle:
    """A worker's side of DESIGN §10.1: its ``Waker`` on the queues' wake
    keys and its ``Timers``. The worker calls ``start(post)`` and ``stop()``
    around a run, ``keep_timers()`` on each pass of its loop, ``block(idle)``
    before each wait (True: arm the waker) and ``on_wake(wake)`` for what
    the waker posted. It uses the worker's ``mq``, ``queues``,
    ``concurrency``, ``_executing``, ``_stopping``, ``_rest`` (queue -> the
    monotonic time it may be claimed) and ``_on_released(queue)``.
    ``wakeups``: the wake-ups used (``claimable``, ``due``, ``reconnect``, and
    ``returned``: markers handed back while busy or stopping)."""

    def __init__(self, worker, block_s: float, sweep_s: float, max_stalls: int) -> None:
        self.worker, self.block_s = worker, block_s
        self.timers = Timers(worker.mq, worker.queues, sweep_s=sweep_s, max_stalls=max_stalls)
        self.wakeups = dict.fromkeys(("claimable", "due", "reconnect", "returned"), 0)
        self.waker: Waker | None = None

    def start(self, post) -> None:
        w = self.worker
        self.waker = Waker(w.mq, w.queues, "wake", post, block_s=self.block_s)
        self.waker.start()

    def stop(self) -> None:
        if self.waker is not None:
            self.waker.stop()

    def block(self, idle: bool) -> bool:
        """Arm the waker when ``idle`` (a free thread, every queue drained),
        else leave the markers to other workers; returns ``idle``."""
        if idle:
            self.waker.arm()
        else:
            self.waker.disarm()
        return idle

    def keep_timers(self) -> bool:
        """Run the timers that are due (what a lease recovery moves, a job
        past its stall limit dying, is a durable event: the pump's dispatcher
        sends its signals). True when any ran (they talked to Redis)."""
        if self.timers.next_in() > 0:
            return False
        outcome = self.timers.run()
        for queue, _ in outcome.released:
            self.worker._on_released(queue)
        return True

    def on_wake(self, wake: Wake) -> None:
        """A marker the waker popped, or its connection's state."""
        w = self.worker
        if wake is UP:  # whatever became claimable or due meanwhile: look now
            self.wakeups["reconnect"] += 1
            w._rest.update(dict.fromkeys(w.queues, 0.0))
            self.timers.wake_all()
        elif wake is DOWN:
            return
        elif wake.member == WAKE_DUE:
            self.wakeups["due"] += 1
            self.timers.learn(wake.queue, wake.score)
            if w._stopping.is_set():
                self.waker.put_back(wake)
        else:
            self.wakeups["claimable"] += 1
            w._rest[wake.queue] = 0.0
            if w._executing >= w.concurrency or w._stopping.is_set():
                # busy after all, or leaving: another idle worker may take it now;
                # this one claims from the queue as soon as a thread frees
                self.wakeups["returned"] += 1
                self.waker.put_back(wake)
