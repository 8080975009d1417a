"""Durable signal events and their dispatcher (DESIGN §10.6; issue 18).

The transitions users act on write an event in the same Lua script as the
transition (``lua/lib/events.lua``): to ``P:{q}:signals``, a stream on the
queue's own slot. A ``Dispatcher`` reads each queue's stream in order, sends
the Django signal of every event to each connected receiver, and deletes the
event only after every receiver returned. So a signal is sent at least once,
in order per queue, even when the process that made the transition dies right
after it; each carries ``event_id`` (``"<queue>:<stream id>"``, the same on
every repeat) for a receiver that must not act twice.

==============  ===================  =============================
event kind      signal               keyword arguments besides
                                     queue, job_id, job_name, event_id
==============  ===================  =============================
completed       ``job_completed``    ``result``
dead            ``job_dead``         ``error``
released        ``parent_released``  (none)
flow_failed     ``flow_failed``      ``error``
cancelled       ``job_cancelled``    ``error``
==============  ===================  =============================

Cost rule: a kind is recorded only while it is in ``P:{q}:signals:kinds``;
``EchoMQ.subscribe_events`` adds the kinds its process has receivers for
(``kinds_connected()``), and every worker, pump and dispatcher calls it when
it starts. A site without receivers writes no event; a completion costs an
event only when a ``job_completed`` receiver is connected.

Failures: a receiver that raises is logged (logger ``echomq_django.events``)
and retried alone (the receivers that returned are not called again by this
dispatcher) after ``backoff_ms``, doubling, until it has raised ``tries``
times; then the event goes to ``P:{q}:signals:deadletter`` with the reason
and the queue's later events flow again. Until then the queue's later events
wait (order per queue). The count of tries is kept in Redis
(``P:{q}:signals:tries``), so a dispatcher that restarts does not start it
over; which receivers already returned is not, so after a restart every
receiver gets the event again (at least once).

Two dispatchers on one queue: a pass holds ``P:{q}:signals:lock`` (a
redis-py ``Lock``, the pump's mechanism, ``lock_ms`` long and renewed before
each event once a third of it has passed); the other skips the queue. A
receiver running longer than ``lock_ms`` can let another dispatcher start the
same event, so keep receivers short (or raise ``lock_ms``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from . import signals

log = logging.getLogger("echomq_django.events")

SIGNAL_OF = {
    "completed": "job_completed",
    "dead": "job_dead",
    "released": "parent_released",
    "flow_failed": "flow_failed",
    "cancelled": "job_cancelled",
}
VALUE_ARG = {"completed": "result", "dead": "error", "flow_failed": "error", "cancelled": "error"}
DEADLETTER_MAX = 10_000  # dead-lettered events kept per queue, newest


def kinds_connected() -> list[str]:
    """The event kinds whose signal has at least one receiver connected in
    this process, in ``SIGNAL_OF`` order."""
    return [kind for kind, name in SIGNAL_OF.items() if getattr(signals, name).receivers]


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
        """The signal's keyword arguments (see the module's table)."""
        out = {"queue": self.queue, "job_id": self.job_id, "job_name": self.job_name}
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
