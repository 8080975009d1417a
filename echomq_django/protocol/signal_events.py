"""Signal events (docs/explanation/house.md, "protocol/"): the Redis half of durable
signals. The transition scripts write an event (``lua/lib/signal_events.lua``);
the dispatcher (``runners/dispatcher.py``) reads them, sends their Django
signals and acknowledges them (``lua/ack_signals.lua``); stats and the admin
read the backlog and the dead letters.

Keys, all on the queue's own slot: ``P:{q}:signals`` (stream of undispatched
events, never trimmed), ``P:{q}:signals:kinds`` (set: kinds recorded),
``P:{q}:signals:lock`` (a dispatcher's pass), ``P:{q}:signals:tries`` (hash:
event -> sends that raised), ``P:{q}:signals:deadletter`` (list, newest last,
capped at ``DEADLETTER_MAX``).

``SignalEvents`` is the part ``mq.signal_events``. These are not the
``P:{q}:events`` stream the admin mirror reads (``probes.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from ..core.jobs import to_text as _text
from ..core.refs import JobRef
from .errors import translating
from .probes import backlog_commands, backlog_of
from .wire import Part

SIGNAL_OF = {
    "completed": "job_completed",
    "dead": "job_dead",
    "released": "parent_released",
    "flow_failed": "flow_failed",
    "cancelled": "job_cancelled",
}
VALUE_ARG = {"completed": "result", "dead": "error", "flow_failed": "error", "cancelled": "error"}
ERROR_KINDS = frozenset(k for k, arg in VALUE_ARG.items() if arg == "error")
DEADLETTER_MAX = 10_000  # dead-lettered events kept per queue, newest


@dataclass(frozen=True)
class Event:
    """One durable event as read from ``P:{q}:signals``."""

    queue: str
    xid: str  # the stream id, e.g. "1733040000000-0"
    kind: str
    job_id: str
    job_name: str
    value: str | None

    @property
    def event_id(self) -> str:
        """``"<queue>:<stream id>"``: unique per prefix and Redis, the same on a repeat."""
        return f"{self.queue}:{self.xid}"

    def kwargs(self) -> dict:
        """The signal's keyword arguments (see the module's table): ``ref``
        is the job's ``JobRef``; ``flow_failed`` adds ``child``, the
        ``JobRef`` of the child that failed the parent (None when the error
        does not name one). docs/explanation/signals.md"""
        out = {
            "queue": self.queue,
            "job_id": self.job_id,
            "ref": JobRef._trusted(self.queue, self.job_id),
            "job_name": self.job_name,
        }
        if self.kind == "flow_failed":
            out["child"] = failing_child(self.value)
        arg = VALUE_ARG.get(self.kind)
        if arg == "result":
            try:
                out[arg] = json.loads(self.value) if self.value is not None else None
            except ValueError:
                out[arg] = self.value
        elif arg:
            out[arg] = self.value
        out["event_id"] = self.event_id
        return out


def failing_child(error: str | None) -> JobRef | None:
    """The child named by a parent's ``failed by child queue/id: ...`` error
    (as ``SignalEvents`` hands it on, keys already written ``queue/id``)."""
    head = "failed by child "
    if not error or not error.startswith(head):
        return None
    try:
        return JobRef.parse(error[len(head) :].partition(": ")[0])
    except ValueError:
        return None


class SignalLock:
    """The lock a dispatch pass holds on a queue's signal events
    (``P:{q}:signals:lock``): non-blocking, usable from any thread, it always
    expires. ``acquire(token)``, ``extend(ms)`` and ``release()`` answer
    whether they worked instead of raising redis-py's ``LockError``; each
    raises ``RedisUnavailable`` while Redis is away."""

    def __init__(self, lock, client) -> None:
        self._lock, self.client = lock, client

    @translating
    def acquire(self, token: str) -> bool:
        """Take the lock under ``token``; False when another pass holds it."""
        return bool(self._lock.acquire(token=token))

    @translating
    def extend(self, lock_ms: int) -> bool:
        """The lock now ends ``lock_ms`` (ms) from now; False when it was lost."""
        try:
            return bool(self._lock.extend(lock_ms / 1000, replace_ttl=True))
        except redis.exceptions.LockError:
            return False

    @translating
    def release(self) -> bool:
        """Drop the lock; False when it had expired (or was taken) already."""
        try:
            self._lock.release()
        except redis.exceptions.LockError:
            return False
        return True


class SignalEvents(Part):
    """The signal-events part of ``EchoMQ`` (``mq.signal_events``)."""

    def subscribe(self, queues: list[str], kinds: list[str]) -> list[str]:
        """Record events of ``kinds`` (the runners pass
        ``runners.dispatcher.kinds_connected()``, the kinds their process has
        receivers for) for each of ``queues`` from
        now on: one SADD per queue to ``P:{q}:signals:kinds``; a kind another
        process added is never removed. Returns the kinds. Raises
        ``ValueError`` for an unknown kind or a bad queue name, before any
        write."""
        kinds = list(kinds)
        unknown = sorted(set(kinds) - set(SIGNAL_OF))
        if unknown:
            raise ValueError(f"unknown event kinds {unknown}: use {', '.join(SIGNAL_OF)}")
        keys = [self.keys.queue(q).signal_kinds for q in queues]
        if kinds:
            for key in keys:
                self.client.sadd(key, *kinds)
        return kinds

    def read(self, queue: str, count: int) -> list[Event]:
        """The oldest ``count`` undispatched events of ``queue``, in order."""
        out = []
        for xid, fields in self.client.xrange(self.keys.queue(queue).signals, count=count):
            f = {_text(k): _text(v) for k, v in fields.items()}
            out.append(
                self._event(
                    queue, _text(xid), f.get("k", ""), f.get("id", ""), f.get("n", ""), f.get("v")
                )
            )
        return out

    def _event(self, queue: str, xid, kind, job_id, name, value) -> Event:
        """An ``Event``; an error's child keys written ``queue/id``, as every
        public value shows a job (docs/howto/read-flows.md#job-references)."""
        if kind in ERROR_KINDS:
            value = self.keys.unkey(_text(value))
        return Event(queue, _text(xid), kind, job_id, name, value)

    def wait(self, queue: str, block_ms: int) -> None:
        """Block until ``queue`` has an undispatched event (returns at once
        when it has one), at most ``block_ms`` ms; a client socket timeout
        shorter than ``block_ms`` ends the wait early."""
        try:
            self.client.xread({self.keys.queue(queue).signals: "0-0"}, count=1, block=block_ms)
        except redis.exceptions.TimeoutError:
            pass  # the socket timed out first: the caller looks again

    def lock(self, queue: str, lock_ms: int) -> SignalLock:
        """The ``SignalLock`` on ``P:{q}:signals:lock`` (``lock_ms`` ms) a
        dispatch pass holds."""
        return SignalLock(
            self.client.lock(
                self.keys.queue(queue).signal_lock,
                timeout=lock_ms / 1000,
                blocking=False,
                thread_local=False,
            ),
            self.client,
        )

    def count_try(self, queue: str, xid: str) -> int:
        """One more send of event ``xid`` raised; returns how many have."""
        return self.client.hincrby(self.keys.queue(queue).signal_tries, xid, 1)

    def ack(
        self, queue: str, acks: list[tuple[str, str]], read: int = 0
    ) -> tuple[int, list[Event]]:
        """Remove dispatched events and dead-letter given-up ones, in one
        ``ack_signals`` step, then read the next ``read`` events: ``acks`` is
        ``[(stream id, 'ok' or a reason)]``. Returns ``(how many left the
        stream, the next events)``; a replay removes none."""
        k = self.keys.queue(queue)
        reply = self.scripts.run(
            "ack_signals",
            [k.signals, k.signal_deadletter, k.signal_tries],
            [self.clock(), DEADLETTER_MAX, read, *(v for pair in acks for v in pair)],
        )
        data = json.loads(reply)
        return data["removed"], [self._event(queue, *e) for e in data["next"] or ()]

    def backlog(self, queue: str) -> dict:
        """``{"pending": events not dispatched yet, "deadlettered": events
        given up on, "oldest_ms": age in ms of the oldest pending event (None
        when none)}`` for ``queue``; reads only."""
        pipe = self.client.pipeline(transaction=False)
        backlog_commands(pipe, self.keys.queue(queue))
        return backlog_of(pipe.execute(), self.clock())

    def deadlettered(self, queue: str, count: int = 100) -> list[dict]:
        """The newest ``count`` dead-lettered events of ``queue``, newest
        first, each ``{event_id, kind, job_id, job_name, value, reason, tries,
        at}`` (``at``: ms when it was given up on); reads only."""
        raw = self.client.lrange(self.keys.queue(queue).signal_deadletter, -count, -1)
        out = []
        for item in reversed(raw):
            e = json.loads(item)
            out.append(
                {
                    "event_id": f"{queue}:{e.get('event')}",
                    "kind": e.get("k"),
                    "job_id": e.get("id"),
                    "job_name": e.get("n", ""),
                    "value": self.keys.unkey(e.get("v"))
                    if e.get("k") in ERROR_KINDS
                    else e.get("v"),
                    "reason": e.get("reason"),
                    "tries": e.get("tries"),
                    "at": e.get("at"),
                }
            )
        return out
