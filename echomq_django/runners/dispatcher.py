"""The dispatcher: durable signal events and how they are sent (docs/explanation/signals.md).

The transitions users act on write an event in the same Lua script as the
transition (``lua/lib/signal_events.lua``): to ``P:{q}:signals``, a stream on the
queue's own slot. A ``Dispatcher`` reads each queue's stream in order, sends
the Django signal of every event to each connected receiver, and deletes the
event only after every receiver returned. So a signal is sent at least once,
in order per queue, even when the process that made the transition dies right
after it; each carries ``event_id`` (``"<queue>:<stream id>"``, the same on
every repeat) for a receiver that must not act twice.

==============  ===================  =============================
event kind      signal               keyword arguments besides
                                     queue, job_id, ref, job_name,
                                     event_id
==============  ===================  =============================
completed       ``job_completed``    ``result``
dead            ``job_dead``         ``error``
released        ``parent_released``  (none)
flow_failed     ``flow_failed``      ``error``, ``child``
cancelled       ``job_cancelled``    ``error``
==============  ===================  =============================

``ref`` is the job's ``JobRef``; ``child`` the ``JobRef`` of the child that
failed the parent; an error names a child as ``queue/id``
(docs/howto/read-flows.md#job-references).

Cost rule: a kind is recorded only while it is in ``P:{q}:signals:kinds``;
``EchoMQ.subscribe_events`` adds the kinds its process has receivers for
(``kinds_connected()``), and every worker, pump and dispatcher calls it when
it starts. A site without receivers writes no event; a completion costs an
event only when a ``job_completed`` receiver is connected.

Failures: a receiver that raises is logged (logger ``echomq_django.dispatcher``)
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

``Dispatcher(["orders"], mq=None).dispatch_all()`` is one pass over every
queue (what ``Pump.sweep()`` runs); ``start()`` / ``stop()`` run one thread
per queue that blocks on the queue's stream (XREAD BLOCK, ``block_ms``) and
dispatches as soon as an event lands (what ``runpump`` and
``runworker --pump`` run).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.db import close_old_connections

from .. import signals
from ..conf import get_mq, signal_settings
from ..protocol.signal_events import SIGNAL_OF, Event
from .outage import REDIS_DOWN, Outage

log = logging.getLogger("echomq_django.dispatcher")


def kinds_connected() -> list[str]:
    """The event kinds whose signal has at least one receiver connected in
    this process, in ``SIGNAL_OF`` order."""
    return [kind for kind, name in SIGNAL_OF.items() if getattr(signals, name).receivers]


DEFAULT_TRIES = 3
DEFAULT_BACKOFF_MS = 500


@dataclass
class DispatchReport:
    """What one pass over one queue did: events ``sent`` (every receiver
    returned), ``deadlettered``, whether a failing event waits for its next
    try (``retry_in_ms``), the queue was ``locked`` by another dispatcher, or
    the lock was ``lock_lost`` mid-pass."""

    sent: int = 0
    deadlettered: int = 0
    retry_in_ms: int | None = None
    locked: bool = False
    lock_lost: bool = False


def _receivers(signal) -> list[tuple[object, bool]]:
    """The live receivers of ``signal`` for any sender, each with whether it
    is a coroutine function (Django >= 5.0 keeps them apart)."""
    live = signal._live_receivers(None)
    if isinstance(live, tuple):  # Django >= 5.0: (sync, async)
        return [(r, False) for r in live[0]] + [(r, True) for r in live[1]]
    return [(r, iscoroutinefunction(r)) for r in live]


class Dispatcher:
    """Sends the signals of ``queues``' durable events
    (docs/explanation/protocol.md#durable-signal-events).

    ``queues``: queue names; ``mq``: an ``EchoMQ`` with the ``EventCalls``
    methods (None: the one from settings);
    ``batch``: events read per round trip; ``tries``: sends to a receiver
    that raises before the event is dead-lettered (default ``ECHOMQ
    ["SIGNAL_TRIES"]``, 3); ``backoff_ms`` (ms): wait before the second try,
    doubling (default ``ECHOMQ["SIGNAL_BACKOFF_MS"]``, 500); ``lock_ms``
    (ms): how long a pass holds a queue before it must renew; ``block_ms``
    (ms): the longest a ``start()`` thread blocks before it looks again.
    ``before_ack(queue, acks)`` runs between sending and acking (the tests'
    kill point). Signals go out with ``sender`` = this dispatcher. Raises
    ``ValueError`` for a bad queue name or a bad number.
    """

    def __init__(
        self,
        queues: list[str],
        mq=None,
        *,
        batch: int = 100,
        tries: int | None = None,
        backoff_ms: int | None = None,
        lock_ms: int = 10_000,
        block_ms: int = 1000,
        before_ack=None,
    ) -> None:
        mq = get_mq() if mq is None else mq
        if tries is None or backoff_ms is None:
            conf = signal_settings()
            tries = conf["SIGNAL_TRIES"] if tries is None else tries
            backoff_ms = conf["SIGNAL_BACKOFF_MS"] if backoff_ms is None else backoff_ms
        for name, value, low in (
            ("batch", batch, 1),
            ("tries", tries, 1),
            ("backoff_ms", backoff_ms, 0),
            ("lock_ms", lock_ms, 100),
            ("block_ms", block_ms, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        self.mq = mq
        self.queues = [q for q in queues if mq.keys.base(q)]
        self.batch, self.tries, self.backoff_ms = batch, tries, backoff_ms
        self.lock_ms, self.block_ms = lock_ms, block_ms
        self.before_ack = before_ack
        self.sent = self.deadlettered = 0
        self._subscribed = False
        self._failing: dict[tuple[str, str], list] = {}  # (queue, xid) -> receivers that raised
        self._retry_at: dict[str, tuple[str, float]] = {}  # queue -> (xid, monotonic s)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        """True while ``start()``'s threads run."""
        return bool(self._threads)

    def subscribe(self) -> None:
        """Record, from now on, the event kinds this process has receivers
        for on the dispatcher's queues (``mq.signal_events.subscribe``); one
        round trip per queue the first time, nothing after."""
        if not self._subscribed:
            self.mq.signal_events.subscribe(self.queues, kinds_connected())
            self._subscribed = True

    # -- one pass ---------------------------------------------------------

    def dispatch_all(self) -> dict[str, DispatchReport]:
        """One pass over every queue; ``{queue: DispatchReport}``."""
        return {queue: self.dispatch(queue) for queue in self.queues}

    def dispatch(self, queue: str) -> DispatchReport:
        """Send ``queue``'s pending events in order until none is left, one
        waits for its next try, or the lock is lost. Raises
        ``RedisUnavailable`` when Redis does not answer
        (nothing acked is lost; the unacked events are sent again)."""
        self.subscribe()
        report = DispatchReport()
        waiting = self._retry_at.get(queue)
        if waiting and waiting[1] > time.monotonic():
            report.retry_in_ms = int((waiting[1] - time.monotonic()) * 1000) + 1
            return report
        lock = self.mq.signal_events.lock(queue, self.lock_ms)
        if not lock.acquire(uuid.uuid4().hex):
            report.locked = True
            return report
        renew_at = time.monotonic() + self.lock_ms / 3000
        try:
            _close_old_connections()  # receivers may use the database
            events = self.mq.signal_events.read(queue, self.batch)
            while events:
                live: dict = {}  # signal -> its receivers, looked up once per batch
                acks: list[tuple[str, str]] = []
                stopped = False
                for event in events:
                    if time.monotonic() >= renew_at:
                        if not lock.extend(self.lock_ms):
                            report.lock_lost, stopped = True, True
                            break
                        renew_at = time.monotonic() + self.lock_ms / 3000
                    action = self._deliver(event, report, live)
                    if action is None:
                        stopped = True
                        break
                    acks.append((event.xid, action))
                events = self._ack(queue, acks, 0 if stopped else self.batch)
                sent = sum(1 for _, a in acks if a == "ok")
                report.sent += sent
                report.deadlettered += len(acks) - sent
                self.sent += sent
                self.deadlettered += len(acks) - sent
        finally:
            _close_old_connections()
            if not lock.release():
                log.warning("signals lock on %s expired during a dispatch pass", queue)
        return report

    def _deliver(self, event: Event, report: DispatchReport, live: dict) -> str | None:
        """Send one event; ``'ok'``, a dead-letter reason, or None when it
        waits for its next try (``report.retry_in_ms`` set)."""
        name = SIGNAL_OF.get(event.kind)
        if name is None:
            log.error("event %s has unknown kind %r: dead-lettered", event.event_id, event.kind)
            return f"unknown event kind {event.kind!r}"
        signal = getattr(signals, name)
        key = (event.queue, event.xid)
        if signal not in live:
            live[signal] = _receivers(signal)
        failed = self._send(signal, live[signal], event, self._failing.get(key))
        if not failed:
            self._failing.pop(key, None)
            self._retry_at.pop(event.queue, None)
            return "ok"
        tries = self.mq.signal_events.count_try(event.queue, event.xid)
        if tries >= self.tries:
            self._failing.pop(key, None)
            self._retry_at.pop(event.queue, None)
            reason = "; ".join(f"{_label(r)} raised {exc!r}" for r, exc in failed)
            log.error(
                "%s for %s/%s (event %s) dead-lettered after %d tries: %s",
                name,
                event.queue,
                event.job_id,
                event.event_id,
                tries,
                reason,
            )
            return f"{reason} ({tries} tries)"
        self._failing[key] = [r for r, _ in failed]
        wait_ms = self.backoff_ms * 2 ** (tries - 1)
        self._retry_at[event.queue] = (event.xid, time.monotonic() + wait_ms / 1000)
        report.retry_in_ms = wait_ms
        return None

    def _send(
        self, signal, receivers: list, event: Event, only: list | None
    ) -> list[tuple[object, Exception]]:
        """Call each receiver (only those in ``only`` when given); returns
        ``(receiver, exception)`` for each that raised, logged at ERROR."""
        kwargs = event.kwargs()
        failed = []
        for receiver, is_async in receivers:
            if only is not None and receiver not in only:
                continue
            try:
                if is_async:
                    async_to_sync(receiver)(signal=signal, sender=self, **kwargs)
                else:
                    receiver(signal=signal, sender=self, **kwargs)
            except Exception as exc:
                log.error(
                    "signal receiver %s raised %r for %s/%s (event %s)",
                    _label(receiver),
                    exc,
                    event.queue,
                    event.job_id,
                    event.event_id,
                    exc_info=exc,
                )
                failed.append((receiver, exc))
        return failed

    def _ack(self, queue: str, acks: list[tuple[str, str]], read: int) -> list[Event]:
        """Ack ``acks`` and read the next ``read`` events (one round trip)."""
        if self.before_ack is not None:
            self.before_ack(queue, acks)
        if not acks:
            return self.mq.signal_events.read(queue, read) if read else []
        return self.mq.signal_events.ack(queue, acks, read)[1]

    # -- threads ----------------------------------------------------------

    def start(self) -> None:
        """Dispatch in the background: one daemon thread per queue, each
        blocking on its queue's stream. ``stop()`` ends them."""
        self._stop.clear()
        for queue in self.queues:
            t = threading.Thread(target=self._serve, args=(queue,), daemon=True)
            t.name = f"echomq-dispatch-{queue}"
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the ``start()`` threads and wait for them (at most ``timeout``
        s each; default: a block plus a second)."""
        self._stop.set()
        for t in self._threads:
            t.join(self.block_ms / 1000 + 1 if timeout is None else timeout)
        self._threads = []

    def _serve(self, queue: str) -> None:
        outage = Outage(self.mq.client, log)
        pause = 0.5
        while not self._stop.is_set():
            try:
                if outage.down:
                    self.mq.ping()  # a receiver's retry wait sends nothing: no false recovery
                report = self.dispatch(queue)
                outage.ok()
                if report.retry_in_ms is not None:
                    self._stop.wait(report.retry_in_ms / 1000)
                elif report.locked:  # another dispatcher drains it: look again soon
                    self._stop.wait(min(self.lock_ms, self.block_ms) / 1000)
                elif not report.lock_lost:
                    self._wait_for_event(queue)
                pause = 0.5
            except REDIS_DOWN as err:
                self._stop.wait(outage.failed(err))
            except Exception:
                log.exception("dispatcher for %s failed; retrying in %.1fs", queue, pause)
                self._stop.wait(pause)
                pause = min(pause * 2, 10.0)

    def _wait_for_event(self, queue: str) -> None:
        """Block until ``queue`` has an event (at once when it has), at most
        ``block_ms``."""
        self.mq.signal_events.wait(queue, self.block_ms)


def _close_old_connections() -> None:
    """``django.db.close_old_connections()``, logged instead of raised: a
    database that cannot be checked must not stop the signals."""
    try:
        close_old_connections()
    except Exception:
        log.warning("close_old_connections() failed before or after a dispatch pass", exc_info=True)


def _label(receiver) -> str:
    """``module.qualname`` of a receiver (of its class for a callable object)."""
    name = getattr(receiver, "__qualname__", None) or type(receiver).__qualname__
    return f"{getattr(receiver, '__module__', '?')}.{name}"
