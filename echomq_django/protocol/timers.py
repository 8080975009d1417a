"""Timers and wake-ups (docs/explanation/house.md, "protocol/"): what moves a job
because time passed, and the markers a runner blocks on instead of polling.

Transitions: due delayed jobs to pending (``lua/promote_delayed.lua``),
expired leases back (``lua/recover_stalled.lua``), held parents past their
children deadline (``lua/expire_children.lua``), a rate-limited job back
without spending its attempt (``lua/postpone.lua``), a periodic job's tick
mark (``lua/advance_schedule.lua``).

Wake markers: every script that makes a job claimable wakes its queue on the
queue's own slot (``lua/lib/claimable.lua``): ``P:{q}:wake`` holds ``'0'``
while a job is claimable and no worker was told, and ``'d'`` scored with the
earliest delayed run-at announced; ``P:{q}:flow:wake`` holds ``'0'`` while
the outbox has entries for the pump. ``Markers`` pops them with
``BZPOPMIN``: on one server one command over every queue, on its own
connection; on a Redis Cluster one command per queue, routed to its slot.

``Timers`` is the part ``mq.timers``; the worker's reporter and timers, the
pump and the periodic jobs call it (``runners/``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ..core.jobs import Outcome, to_text
from ..core.options import MAX_MS, check_int
from .control.commands import NUDGE, PENDING_TTL_MS
from .errors import AWAY, connection_error, unblocked
from .scripts import socket_timeout
from .wire import Part, Wire

WAKE_NOW, WAKE_DUE = "0", "d"  # the members lua/lib/claimable.lua writes
# the QueueKeys fields whose keys hold what a worker's timers act on: an idle
# queue has none of them (Timers.busy)
WATCHED = ("pending", "prioritized", "delayed", "active", "deadlines", "gc", "cancel", "expire")
SOCKET_MARGIN_S = 1.0  # a blocking read waits this much longer than its command
# what a blocked pop meets while Redis is away is errors.AWAY: a Cluster with no
# node answering raises RedisClusterException, not a ConnectionError


@dataclass(frozen=True)
class Wake:
    """A popped marker (``queue``, ``member`` ``'0'`` or ``'d'``, ``score``:
    0, or the run-at in ms), or a runner's note of the connection's state
    (``runners.wake.DOWN`` / ``UP``: queue ``''``), or with ``command`` a
    worker command popped from its key (queue ``''``, ``member`` its JSON,
    ``score`` when it was sent; ``protocol/control/commands.py``)."""

    queue: str
    member: str
    score: int = 0
    command: bool = False


class Markers:
    """Pops the wake markers of ``field`` (``"wake"`` or ``"outbox_wake"``)
    of ``queues`` (see the module). ``block_s`` (s): the longest single
    ``BZPOPMIN``; ``groups``: the queues one command covers (all on one
    server, one each on a Cluster).

    Each group blocks on a connection of its own (a private pool: to the
    server, or to the node of the queue's slot on a Cluster, found again
    after an error or a ``MOVED``), so ``cut()`` ends a blocked command at
    once, and a connection cut off can never reconnect: a waker thread that
    raced past its stop check finds it refused instead of blocking for
    ``block_s``. A client whose pool is not a plain one (Sentinel...) blocks
    on the shared client, ``block_s`` bounded below its socket timeout, and
    ``cut()`` cannot end it: the thread returns within ``block_s``.
    Thread-safe.

    ``commands``: a worker's command key (``P:{q}:commands:<id>``, ``q`` the
    first of ``queues``), or None: the first group's ``pop`` blocks on it
    too, so an idle worker hears a command in the command it blocks in
    anyway; ``pop_commands()`` blocks on it alone (a busy worker), and
    ``nudge()`` ends that wait."""

    def __init__(
        self, wire: Wire, queues: list[str], field: str, block_s: float, commands=None
    ) -> None:
        self.wire, self.field, self.block_s, self.commands = wire, field, block_s, commands
        client = wire.client
        self.cluster = isinstance(client, RedisCluster)
        self._cut = threading.Event()
        self._lock = threading.Lock()
        # one blocking command per slot: every queue at once on one server
        self.groups = [[q] for q in queues] if self.cluster else [list(queues)]
        self._readers: dict[str, redis.Redis] = {}  # the group's first queue -> its client
        self._group_of = {q: group[0] for group in self.groups for q in group}
        for group in self.groups:
            reader = self._reader_for(group[0])
            if reader is None:  # not a plain pool: every group uses the shared client
                self._readers.clear()
                break
            self._readers[group[0]] = reader
        timeout = None if self._readers else socket_timeout(client)
        if timeout:  # the shared client: end before its socket does
            self.block_s = max(0.1, min(block_s, timeout - SOCKET_MARGIN_S))

    def key(self, queue: str) -> str:
        return getattr(self.wire.keys.queue(queue), self.field)

    def pop(self, queues: list[str]) -> Wake | None:
        """Block up to ``block_s`` for a marker of one of ``queues`` (one
        group, tried in that order); None when none came. Raises
        ``RedisUnavailable`` while Redis cannot be reached, and once
        ``cut()`` ended the wait."""
        keys = {self.key(q): q for q in queues}
        if self.commands and self._group_of[queues[0]] == self.groups[0][0]:
            keys = {self.commands: None, **keys}  # the same slot as the group's first queue
        return self._pop(keys, queues)

    def pop_commands(self) -> Wake | None:
        """Block up to ``block_s`` on the command key alone (None when none
        came; a ``nudge`` comes back as a command ``NUDGE``). Raises as ``pop``."""
        return self._pop({self.commands: None}, self.groups[0])

    def nudge(self) -> None:
        """End a ``pop_commands`` wait at once (the worker wants its wake
        markers again). Raises ``RedisUnavailable``."""
        pipe = self.wire.client.pipeline(transaction=False)
        pipe.zadd(self.commands, {NUDGE: 0})
        pipe.pexpire(self.commands, PENDING_TTL_MS)  # left behind by a worker that stopped
        try:
            pipe.execute()
        except AWAY as err:
            raise connection_error(self.wire.client, err) from err

    def _pop(self, keys: dict, queues: list[str]) -> Wake | None:
        client = self.wire.client
        try:
            client = self._client(queues)
            got = client.bzpopmin(list(keys), timeout=self.block_s)
        except redis.exceptions.MovedError as err:  # the slot moved: block there next
            self._forget(queues, (err.host, int(err.port)))
            raise connection_error(client, err) from err
        except AWAY as err:
            self._forget(queues)  # a Cluster node may have failed over: look it up again
            raise connection_error(client, err) from err
        except redis.exceptions.ResponseError as err:
            if not unblocked(err):
                raise
            self._forget(queues)  # UNBLOCKED: its master was demoted (a failover)
            raise connection_error(client, err) from err
        if not got:
            return None
        key, member, score = got
        queue = keys[to_text(key)]
        return Wake(queue or "", to_text(member), int(score), command=queue is None)

    def put_back(self, wake: Wake) -> None:
        """Return a popped marker for another runner (``'d'`` keeps the
        earliest run-at). Raises ``RedisUnavailable``."""
        key = self.commands if wake.command else self.key(wake.queue)
        try:
            if wake.member == WAKE_DUE and not wake.command:
                self.wire.client.zadd(key, {WAKE_DUE: wake.score}, lt=True)
            else:
                self.wire.client.zadd(key, {wake.member: wake.score})
        except AWAY as err:
            raise connection_error(self.wire.client, err) from err

    def cut(self) -> None:
        """End every command blocked on this reader's own connections, and
        refuse them any new connection (see the class)."""
        self._cut.set()
        with self._lock:
            readers = list(self._readers.values())
        for reader in readers:
            if reader is not None:
                reader.connection_pool.disconnect()

    def _client(self, queues: list[str]):
        if not self._readers:
            return self.wire.client
        group = self._group_of[queues[0]]
        with self._lock:
            reader = self._readers.get(group)
        if reader is None:  # a Cluster reader forgotten after an error: the slot's node now
            # the slot map again (a failover promotes a replica), as redis-py does
            # after a connection error; it raises while no node answers
            self.wire.client.nodes_manager.initialize()
            reader = self._reader_for(group)
            with self._lock:
                self._readers[group] = reader  # refused to connect once cut, too
        return reader or self.wire.client

    def _forget(self, queues: list[str], address: tuple[str, int] | None = None) -> None:
        if not self.cluster or not self._readers:
            return
        group = self._group_of[queues[0]]
        reader = self._reader_for(group, address) if address else None
        with self._lock:
            old, self._readers[group] = self._readers.get(group), reader
        if old is not None:
            old.connection_pool.disconnect()

    def _reader_for(self, queue: str, address: tuple[str, int] | None = None):
        client = self.wire.client
        if self.cluster:
            node = client.get_node_from_key(self.key(queue))
            if node is None:
                return None
            client = client.get_redis_connection(node)
        return _private_client(client, self.block_s, self._cut, address)


class Timers(Part):
    """The time-driven part of ``EchoMQ`` (``mq.timers``)."""

    def markers(self, queues: list[str], field: str, block_s: float, commands=None) -> Markers:
        """A ``Markers`` reader of ``field`` for ``queues`` (and a worker's
        ``commands`` key, or None)."""
        return Markers(self.wire, queues, field, block_s, commands)

    def promote_delayed(self, queue: str, limit: int = 1000) -> int:
        """Move up to ``limit`` due delayed jobs to pending; returns how many."""
        k = self.keys.queue(queue)
        return int(
            self.scripts.run(
                "promote_delayed",
                [k.delayed, k.pending],
                [k.base, self.clock(), limit],
            )
        )

    def recover_stalled(self, queue: str, limit: int = 1000, max_stalls: int = 1) -> Outcome:
        """Active jobs whose lease expired go back to pending; a job that
        stalls more than ``max_stalls`` times dies (its parent's policy
        applies). Returns the ``Outcome`` (``recovered`` count, ``dead``)."""
        k = self.keys.queue(queue)
        reply = self.scripts.run(
            "recover_stalled",
            [k.active, k.pending],
            [queue, k.base, self.clock(), limit, max_stalls],
        )
        return self.wire.outcome(reply)

    def expire_children(self, queue: str, limit: int = 1000):
        """Kill held parents of ``queue`` whose ``children_timeout_ms`` has
        passed (error ``children timed out``; their policy applies upward).
        Returns ``(expired, outcome)``: how many parents timed out, and the
        ``Outcome`` (``dead``, ``flow_failed`` up the tree). Run by the pump
        and by a worker's timers. docs/howto/priorities-rate-limits.md#flow-control"""
        k = self.keys
        reply = self.scripts.run(
            "expire_children",
            [k.queue(queue).deadlines],
            [queue, k.base(queue), self.clock(), limit],
        )
        return json.loads(reply).get("expired", 0), self.wire.outcome(reply)

    def postpone(self, job, retry_after_ms: int) -> int:
        """Put an active job back without spending its attempt; it runs again
        in ``retry_after_ms`` (ms). Returns the run-at (ms). The worker calls
        it when a handler raises ``RateLimited``. Raises ``JobNotFound``,
        ``JobNotActive``, ``LeaseLost``. docs/howto/priorities-rate-limits.md#rate-limits"""
        check_int("retry_after_ms", retry_after_ms, 0, MAX_MS)
        q, k = job.queue, self.keys.queue(job.queue)
        return int(
            self.scripts.run(
                "postpone",
                [k.job(job.id), k.delayed, k.active],
                [q, job.id, job.lease or "", self.clock(), retry_after_ms],
            )
        )

    # -- periodic jobs (runners/periodic.py drives these) --------------------
    def advance_schedule(self, queue: str, entry: str, tick: int, mode: str) -> int:
        """Move entry's last-tick mark (ms): ``mode`` 'fire' (forward only) or
        'init' (only when unset). Returns the mark. docs/howto/periodic.md#how-it-fires"""
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

    # -- what a worker's timers read (runners/wake.py) ------------------------
    def next_run_at(self, queue: str) -> int | None:
        """The earliest run-at (ms) of ``queue``'s delayed jobs; None when none."""
        head = self.client.zrange(self.keys.queue(queue).delayed, 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def oldest_lease(self, queue: str) -> int | None:
        """The earliest lease deadline (ms) of ``queue``'s active jobs; None
        when none is active (a read)."""
        return _head(self.client.zrange(self.keys.queue(queue).active, 0, 0, withscores=True))

    def next_children_deadline(self, queue: str) -> int | None:
        """The earliest ``children_timeout_ms`` deadline (ms) of ``queue``'s
        held parents; None when none (a read). docs/howto/priorities-rate-limits.md#flow-control"""
        k = self.keys.queue(queue)
        return _head(self.client.zrange(k.deadlines, 0, 0, withscores=True))

    def busy(self, queues: list[str]) -> set[str]:
        """Which of ``queues`` hold anything a worker's timers watch: a
        pending, delayed or active job, a children deadline, queued removals
        or cancels, a job with its own keep (``WATCHED``). An idle worker
        asks this instead of sweeping: on one server one ``EXISTS`` over
        every queue's keys answers for all of them when all are empty (then
        one per queue to tell which, when some are not); on a Redis Cluster
        one ``EXISTS`` per queue (a command may not span slots). A read.
        docs/explanation/no-polling.md#what-an-idle-worker-costs"""
        names = list(queues)
        if not names:
            return set()
        watched = {q: [getattr(self.keys.queue(q), f) for f in WATCHED] for q in names}
        one_server = not isinstance(self.client, RedisCluster)
        if one_server and len(names) > 1 and not self.client.exists(*_flat(watched.values())):
            return set()
        pipe = self.client.pipeline(transaction=False)
        for q in names:
            pipe.exists(*watched[q])
        return {q for q, n in zip(names, pipe.execute(), strict=True) if n}

    def sweep(self, queue: str, token: str, lock_ms: int) -> Swept | None:
        """Take ``queue``'s timers lock for ``lock_ms`` (ms) under ``token``
        (it expires, never released: one sweep per queue per interval however
        many workers run; the holder's own token takes it again). None when
        another worker holds it; else, in one round trip, a ``Swept``: the
        earliest delayed run-at, lease deadline, children deadline and own
        keep (ms, None for none), whether a job is claimable and whether
        removals or cancels are queued."""
        k = self.keys.queue(queue)
        held = self.client.set(k.timers_lock, token, nx=True, px=int(lock_ms), get=True)
        if held is not None and to_text(held) != token:
            return None
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(k.delayed, 0, 0, withscores=True)
        pipe.zrange(k.active, 0, 0, withscores=True)
        pipe.exists(k.pending, k.prioritized, k.groups)  # claimable: priorities, groups too
        pipe.zrange(k.deadlines, 0, 0, withscores=True)
        pipe.exists(k.gc, k.cancel)
        pipe.zrange(k.expire, 0, 0, withscores=True)
        delayed, active, claimable, deadlines, queued, keep = pipe.execute()
        return Swept(
            _head(delayed), _head(active), bool(claimable), _head(deadlines), bool(queued),
            _head(keep),
        )  # fmt: skip

    def wake(self, queue: str) -> None:
        """Leave a ``'0'`` marker on ``queue``: a job is claimable (one a
        killed worker took with it may have been lost)."""
        self.client.zadd(self.keys.queue(queue).wake, {WAKE_NOW: 0})


@dataclass(frozen=True)
class Swept:
    """What a sweep read of one queue (ms, None for none): ``next_run_at``
    (earliest delayed run-at), ``oldest_lease`` (earliest lease deadline),
    ``claimable`` (a job is pending), ``children_deadline`` (earliest
    ``children_timeout_ms`` deadline of a held parent), ``queued`` (removals
    or cancels wait in the work lists), ``next_keep`` (earliest time a job's
    own keep runs out)."""

    next_run_at: int | None
    oldest_lease: int | None
    claimable: bool
    children_deadline: int | None
    queued: bool = False
    next_keep: int | None = None


def _flat(lists) -> list:
    return [x for part in lists for x in part]


def _head(pairs) -> int | None:
    """The score (ms) of a ``ZRANGE ... 0 0 WITHSCORES`` reply, or None."""
    return int(pairs[0][1]) if pairs else None


_POOL_KWARGS_DROPPED = ("orig_", "maint_notifications", "himport")


def _private_client(
    client, block_s: float, cut: threading.Event, address: tuple[str, int] | None = None
) -> redis.Redis | None:
    """A client on a pool of its own to ``client``'s server (or ``address``,
    a ``(host, port)`` on the same Cluster): a blocked command can be cut
    off, its socket outlives the command by ``SOCKET_MARGIN_S`` whatever the
    shared client's timeout, and once ``cut`` is set its connections refuse
    to connect again. A blocking command is never re-sent (it may have
    popped). None when the pool is not a plain one (Sentinel...)."""
    pool = getattr(client, "connection_pool", None)
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return None
    kwargs = {
        k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_KWARGS_DROPPED)
    }
    if address is not None:
        kwargs["host"], kwargs["port"] = address
    kwargs["socket_timeout"] = block_s + SOCKET_MARGIN_S
    kwargs["retry"] = Retry(NoBackoff(), 0)
    try:
        private = redis.ConnectionPool(
            connection_class=_refusing(pool.connection_class, cut), **kwargs
        )
    except TypeError:
        return None
    return redis.Redis(connection_pool=private)


def _refusing(connection_class: type, cut: threading.Event) -> type:
    """``connection_class`` whose socket connect is refused once ``cut`` is set."""

    def _connect(self):
        if cut.is_set():
            raise redis.exceptions.ConnectionError("the wake-up reader was stopped")
        return connection_class._connect(self)

    return type(f"Cuttable{connection_class.__name__}", (connection_class,), {"_connect": _connect})
