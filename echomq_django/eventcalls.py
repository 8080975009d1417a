"""Durable-signal calls of ``EchoMQ`` (DESIGN §10.6; issue 18): the Redis
half of the dispatcher (``dispatch.py``) and the reads stats and the admin
show. The events themselves are written by the transition scripts
(``lua/lib/events.lua``); ``events.py`` says what one is.

Keys, all on the queue's own slot: ``P:{q}:signals`` (stream of undispatched
events, never trimmed), ``P:{q}:signals:kinds`` (set: kinds recorded),
``P:{q}:signals:lock`` (a dispatcher's pass), ``P:{q}:signals:tries`` (hash:
event -> sends that raised), ``P:{q}:signals:deadletter`` (list, newest last,
capped at ``DEADLETTER_MAX``).

``EventCalls`` is mixed into ``EchoMQ``, as ``FlowCalls`` is; it expects
``self.client``, ``self.keys``, ``self.scripts`` and ``self.clock``.
"""

from __future__ import annotations

import json

from .events import DEADLETTER_MAX, SIGNAL_OF, Event, kinds_connected
from .jobs import to_text as _text


class EventCalls:
    """Durable-signal methods of ``EchoMQ``."""

    def subscribe_events(self, queues: list[str], kinds: list[str] | None = None) -> list[str]:
        """Record events of ``kinds`` (default: ``events.kinds_connected()``,
        the kinds this process has receivers for) for each of ``queues`` from
        now on: one SADD per queue to ``P:{q}:signals:kinds``; a kind another
        process added is never removed. Returns the kinds. Raises
        ``ValueError`` for an unknown kind or a bad queue name, before any
        write."""
        kinds = kinds_connected() if kinds is None else list(kinds)
        unknown = sorted(set(kinds) - set(SIGNAL_OF))
        if unknown:
            raise ValueError(f"unknown event kinds {unknown}: use {', '.join(SIGNAL_OF)}")
        keys = [self.keys.queue(q).signal_kinds for q in queues]
        if kinds:
            for key in keys:
                self.client.sadd(key, *kinds)
        return kinds

    def read_events(self, queue: str, count: int) -> list[Event]:
        """The oldest ``count`` undispatched events of ``queue``, in order."""
        out = []
        for xid, fields in self.client.xrange(self.keys.queue(queue).signals, count=count):
            f = {_text(k): _text(v) for k, v in fields.items()}
            out.append(
                Event(
                    queue, _text(xid), f.get("k", ""), f.get("id", ""), f.get("n", ""), f.get("v")
                )
            )
        return out

    def wait_for_events(self, queue: str, block_ms: int) -> None:
        """Block until ``queue`` has an undispatched event (returns at once
        when it has one), at most ``block_ms`` ms."""
        self.client.xread({self.keys.queue(queue).signals: "0-0"}, count=1, block=block_ms)

    def events_lock(self, queue: str, lock_ms: int):
        """The redis-py ``Lock`` on ``P:{q}:signals:lock`` (``lock_ms`` ms,
        non-blocking, usable from any thread) a dispatch pass holds."""
        return self.client.lock(
            self.keys.queue(queue).signal_lock,
            timeout=lock_ms / 1000,
            blocking=False,
            thread_local=False,
        )

    def count_event_try(self, queue: str, xid: str) -> int:
        """One more send of event ``xid`` raised; returns how many have."""
        return self.client.hincrby(self.keys.queue(queue).signal_tries, xid, 1)

    def ack_events(
        self, queue: str, acks: list[tuple[str, str]], read: int = 0
    ) -> tuple[int, list[Event]]:
        """Remove dispatched events and dead-letter given-up ones, in one
        ``signals_ack`` step, then read the next ``read`` events: ``acks`` is
        ``[(stream id, 'ok' or a reason)]``. Returns ``(how many left the
        stream, the next events)``; a replay removes none."""
        k = self.keys.queue(queue)
        reply = self.scripts.run(
            "signals_ack",
            [k.signals, k.signal_deadletter, k.signal_tries],
            [self.clock(), DEADLETTER_MAX, read, *(v for pair in acks for v in pair)],
        )
        data = json.loads(reply)
        return data["removed"], [Event(queue, *e) for e in data["next"] or ()]

    def event_backlog(self, queue: str) -> dict:
        """``{"pending": events not dispatched yet, "deadlettered": events
        given up on, "oldest_ms": age in ms of the oldest pending event (None
        when none)}`` for ``queue``; reads only."""
        k = self.keys.queue(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(k.signals)
        pipe.llen(k.signal_deadletter)
        pipe.xrange(k.signals, count=1)
        pending, lettered, first = pipe.execute()
        oldest = None
        if first:
            oldest = max(0, self.clock() - int(_text(first[0][0]).partition("-")[0]))
        return {"pending": pending, "deadlettered": lettered, "oldest_ms": oldest}

    def deadlettered_events(self, queue: str, count: int = 100) -> list[dict]:
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
                    "value": e.get("v"),
                    "reason": e.get("reason"),
                    "tries": e.get("tries"),
                    "at": e.get("at"),
                }
            )
        return out
