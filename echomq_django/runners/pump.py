"""The pump: the per-queue sweep (docs/explanation/house.md, "runners/").

One ``Pump(queues).sweep()`` pass, for each queue:

1. delivers its outbox (cross-queue fan-in; ``delivery.py`` says how, under
   which lock, and what becomes of an entry whose parent is gone);
2. promotes due delayed jobs;
3. recovers expired leases (a job past the stall limit dies);
4. sends the Django signals of the queue's durable events (``dispatcher.py``,
   docs/explanation/protocol.md#durable-signal-events): in ``sweep()`` synchronously, in ``run()``
   from the dispatcher's threads, which block on the queues' signals streams and send
   within milliseconds of a transition.

``Pump.run`` sweeps every ``interval`` seconds and, in between, blocks on its
queues' outbox wake keys (``P:{q}:flow:wake``, wake.py): a child's
completion or death that writes an outbox entry wakes it, and it delivers
that queue's outbox at once, so a cross-queue parent is released within
milliseconds of its last child (docs/explanation/no-polling.md). The interval sweep stays as
the safety net (a wake-up lost with a killed pump; promotion and recovery
where no worker keeps the timers).
"""

from __future__ import annotations

import logging
import queue as _queue
import secrets
import threading
import time

from ..conf import get_mq
from ..core.exceptions import RedisUnavailable
from ..core.keyspace import validate_queue, whole_number
from ..protocol.client import EchoMQ
from . import heartbeat
from .delivery import LOCK_MS, SweepReport, deliver_outbox
from .dispatcher import Dispatcher
from .outage import Outage
from .periodic import Scheduler
from .timers import said_recovered
from .wake import BLOCK_S, Inbox, Wake, Waker

log = logging.getLogger("echomq_django.pump")

SUMMARY_EVERY_S = 10.0  # seconds between the INFO lines of running totals
LOCK_MS_MIN = 100  # shorter leases could lapse between a batch's round trips
LOCKED_RETRY_S = 0.05  # a woken queue whose outbox another pump holds: look again then
STOP_CHECK_S = 0.25  # run() calls should_stop() at least this often (a local check)


def check_interval(interval) -> float:
    """``interval`` if it is a number of seconds > 0; ``ValueError`` naming
    the rule otherwise (an interval of 0 sweeps without a pause: a core spins)."""
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
    return interval


class Pump:
    """Sweeps queues: ``Pump(["orders"], mq=None).sweep()``
    (docs/explanation/protocol.md#the-flow-outbox-and-the-pump).

    ``queues``: list of queue names; ``mq``: an ``EchoMQ`` (None: the one
    built from settings); ``batch``: outbox entries per round trip;
    ``lock_ms`` (ms, >= 100): the lease of a sweep's lock on a queue's
    outbox, renewed after every batch (a peer takes over this long after a
    pump died mid-sweep); ``max_tries`` (>= 1): deliveries of an entry whose
    parent is gone before it is dead-lettered; ``max_stalls`` (>= 0): lease
    expiries a job survives;
    ``after_sweep``: callables ``f(pump, reports)`` run after each sweep (the
    admin mirror hooks in here); ``before_trim``: see ``deliver_outbox``;
    ``scheduler``: a ``schedule.Scheduler`` whose periodic jobs each sweep
    fires (None: the ``ECHOMQ["SCHEDULE"]`` entries on these queues, if
    any), and ``run`` wakes for their ticks;
    ``register``: list this pump among the live processes while ``run()``
    runs (a heartbeat every ``beat_s`` seconds, docs/explanation/house.md#monitoring);
    ``dispatcher``: the ``Dispatcher`` of the queues' durable signals (None:
    one with the settings' tries and backoff).
    Raises ``ValueError`` naming the rule for a bad or missing queue name
    or a ``batch`` (>= 1), ``lock_ms``, ``max_tries``, ``max_stalls`` out of
    range (docs/explanation/reliability.md#bad-input-writes-nothing).
    """

    def __init__(
        self,
        queues: list[str],
        mq: EchoMQ | None = None,
        *,
        batch: int = 500,
        lock_ms: int = LOCK_MS,
        max_tries: int = 3,
        max_stalls: int = 1,
        after_sweep=None,
        before_trim=None,
        scheduler: Scheduler | None = None,
        register: bool = True,
        beat_s: float = heartbeat.HEARTBEAT_S,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.queues = [validate_queue(q) for q in queues]
        if not self.queues:
            raise ValueError("a pump needs at least one queue")
        whole_number("batch", batch, 1)  # 0 would stop promotion and recovery too
        whole_number("lock_ms", lock_ms, LOCK_MS_MIN)  # a lock always expires
        whole_number("max_tries", max_tries, 1)
        whole_number("max_stalls", max_stalls, 0)
        self.token = secrets.token_hex(8)  # this pump's lock token, for its whole life
        self.mq = mq if mq is not None else get_mq()
        if scheduler is None:  # runpump and runworker --pump fire their queues' entries
            scheduler = Scheduler.for_queues(self.mq, queues)
        self.scheduler = scheduler
        self.dispatcher = dispatcher or Dispatcher(self.queues, mq=self.mq)
        self.batch, self.lock_ms, self.max_tries = batch, lock_ms, max_tries
        self.max_stalls = max_stalls
        self.after_sweep = list(after_sweep or [])
        self.before_trim = before_trim
        self.register, self.beat_s = register, beat_s
        self.totals = SweepReport()
        self.wakeups = 0  # outbox deliveries a wake-up started (run())
        self.waiting = False  # run() is blocked on the outbox wake keys
        self._posted = Inbox()  # Wake, or None: stop
        self._stopped = threading.Event()  # stop(): ends an outage backoff at once

    def sweep(self) -> dict[str, dict]:
        """One pass over every queue; returns ``{queue: counts}`` (see
        ``SweepReport``). Raises ``RedisUnavailable`` when Redis is down."""
        reports = {}
        self.dispatcher.subscribe()  # before this sweep's transitions
        fired = self.scheduler.fire_due() if self.scheduler else []
        for queue in self.queues:
            rep = self._deliver_outbox(queue)
            rep.promoted = self.mq.timers.promote_delayed(queue, limit=self.batch * 10)
            stalled = self.mq.timers.recover_stalled(
                queue, limit=self.batch * 10, max_stalls=self.max_stalls
            )
            rep.recovered = stalled.recovered
            said_recovered(log, queue, stalled)
            rep.outcome.merge(stalled)
            rep.expired, expired = self.mq.timers.expire_children(queue, limit=self.batch * 10)
            rep.outcome.merge(expired)
            pruned = self.mq.lifecycle.prune(queue)  # bounded: MAX_CALLS steps of BUDGET units
            rep.pruned = pruned.removed
            rep.outcome.merge(pruned.outcome)
            rep.scheduled = sum(q == queue for q, _ in fired)
            rep.released = len(rep.outcome.released)
            rep.dead = len(rep.outcome.dead)
            reports[queue] = rep
            for name in ("delivered", "deadlettered", "promoted", "recovered", "released", "dead"):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(rep, name))
        if not self.dispatcher.running:  # in run(), its threads send them
            for queue, rep in reports.items():  # after every queue's transitions of this sweep
                rep.signals = self.dispatcher.dispatch(queue).sent
        for hook in self.after_sweep:
            hook(self, reports)
        return {q: r.as_dict() for q, r in reports.items()}

    def deliver(self, queue: str) -> SweepReport:
        """Deliver ``queue``'s outbox now (what a wake-up does between
        sweeps; the signals of what it moved are durable events, sent by the
        dispatcher); ``locked`` in the report when another pump holds that
        outbox. Raises ``RedisUnavailable``."""
        rep = self._deliver_outbox(queue)
        rep.released, rep.dead = len(rep.outcome.released), len(rep.outcome.dead)
        for name in ("delivered", "deadlettered", "released", "dead"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(rep, name))
        return rep

    def _deliver_outbox(self, queue: str) -> SweepReport:
        """``deliver_outbox`` with this pump's settings and lock token."""
        return deliver_outbox(
            self.mq,
            queue,
            self.batch,
            self.lock_ms,
            self.max_tries,
            before_trim=self.before_trim,
            token=self.token,
        )

    def stop(self) -> None:
        """Make ``run()`` return at once (from any thread), from an outage's
        backoff too."""
        self._stopped.set()
        self._posted.put(None)

    def run(
        self,
        interval: float = 1.0,
        once: bool = False,
        should_stop=None,
        on_sweep=None,
        summary_every: float = SUMMARY_EVERY_S,
        block_s: float = BLOCK_S,
    ) -> None:
        """Sweep every ``interval`` seconds (at once again while an outbox
        fills whole batches) until ``should_stop()`` is true, ``stop()`` is
        called, or once; between sweeps, deliver a queue's outbox as soon as
        its wake key says it has entries (``block_s``: the waker's longest
        single blocking command, s). ``on_sweep(reports)`` is called after
        each pass. Logs each pass's non-zero counts at DEBUG and the running
        totals at INFO every ``summary_every`` seconds. A Redis outage is
        waited out with backoff (``outage.Outage``; ``stop()`` ends the wait at
        once), never raised; ``once`` returns after the first pass that
        reached Redis. Unless ``once``, the dispatcher's threads send the
        durable signals meanwhile, from the first pass that reached Redis on
        (stopped on return). Raises
        ``ValueError`` for an ``interval`` that is not a number of seconds > 0
        (0 would spin a core)."""
        if not once:
            check_interval(interval)
        t = self.totals  # a pump's "jobs done": entries delivered, jobs promoted and recovered
        beat = heartbeat.announce(
            self.mq,
            "pump",
            self.queues,
            register=self.register,
            beat_s=self.beat_s,
            status=lambda: {"jobs_done": t.delivered + t.promoted + t.recovered},
            warn=log,  # a queue known nowhere: a typo? (as a worker says)
        )
        log.info(
            "pump started: queues %s, %s",
            ", ".join(self.queues),
            "one sweep" if once else f"a sweep every {interval:g} s and on each wake-up",
        )
        waker = None
        if not once:
            waker = Waker(self.mq, self.queues, "outbox_wake", self._posted.put, block_s=block_s)
            waker.start()
        try:
            self._run(waker, interval, once, should_stop, on_sweep, summary_every)
        finally:
            self.waiting = False
            self._stopped.clear()  # a later run() is not cut short by this stop
            if waker is not None:
                waker.stop()
            self.dispatcher.stop()
            if beat is not None:
                beat.stop()

    def _run(self, waker, interval, once, should_stop, on_sweep, summary_every) -> None:
        outage = Outage(self.mq.client, log)
        summary_at = time.monotonic() + summary_every
        while True:
            started = time.monotonic()
            try:
                reports = self.sweep()
            except RedisUnavailable as err:
                if self._pause(outage.failed(err), should_stop):
                    return
                continue
            outage.ok()
            if not once and not self.dispatcher.running:  # once Redis answered
                self.dispatcher.start()
            if log.isEnabledFor(logging.DEBUG):
                busy = {q: {k: v for k, v in r.items() if v} for q, r in reports.items()}
                log.debug("sweep %s", {q: r for q, r in busy.items() if r} or "idle")
            if time.monotonic() >= summary_at:
                self._log_summary()
                summary_at = time.monotonic() + summary_every
            if on_sweep:
                on_sweep(reports)
            if once or (should_stop and should_stop()):
                return
            busy = any(r["delivered"] >= self.batch for r in reports.values())
            wait = 0 if busy else max(0.0, interval - (time.monotonic() - started))
            if self.scheduler:  # wake for the next periodic tick
                wait = self.scheduler.wait_s(wait)
            try:
                if self._deliver_on_wakeups(waker, wait, should_stop):
                    return
            except RedisUnavailable as err:
                if self._pause(outage.failed(err), should_stop):
                    return

    def _deliver_on_wakeups(self, waker: Waker, seconds: float, should_stop) -> bool:
        """Until the next sweep (``seconds``), block on the outbox wake keys
        and deliver each woken queue's outbox; True when the run should end
        (``stop()``, or ``should_stop()``, checked every ``STOP_CHECK_S``)."""
        deadline, retry = time.monotonic() + seconds, {}  # retry: queue -> when
        while True:
            if should_stop and should_stop():
                return True
            now = time.monotonic()
            for queue in [q for q, at in retry.items() if at <= now]:
                del retry[queue]
                if self.deliver(queue).locked:
                    retry[queue] = now + LOCKED_RETRY_S
            if now >= deadline:
                return False
            waker.arm()
            self.waiting = True
            try:
                timeout = min([deadline, *retry.values()]) - now
                item = self._posted.get(timeout=max(0.0, min(timeout, STOP_CHECK_S)))
            except _queue.Empty:
                continue
            finally:
                self.waiting = False
            items = [item]
            while not self._posted.empty():
                items.append(self._posted.get_nowait())
            if None in items:
                return True
            if any(w.member == "up" for w in items):
                return False  # back from an outage: sweep every queue now
            for queue in dict.fromkeys(w.queue for w in items if isinstance(w, Wake) and w.queue):
                self.wakeups += 1
                if self.deliver(queue).locked:  # another pump is on it: look again soon
                    retry[queue] = time.monotonic() + LOCKED_RETRY_S

    def _pause(self, seconds: float, should_stop) -> bool:
        """Wait ``seconds`` (an outage's backoff); True when the run should end
        meanwhile. ``stop()`` ends the wait at once (it sets the event waited
        on); a ``should_stop()`` that came true is seen within 50 ms (it is
        called between waits of at most that)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if should_stop and should_stop():
                return True
            if self._stopped.wait(left if should_stop is None else min(left, 0.05)):
                return True
        return False

    def _log_summary(self) -> None:
        t = self.totals
        log.info(
            "pump %s, totals since start: delivered %d, dead-lettered %d, promoted %d, "
            "recovered %d, released %d, dead %d, signals %d",
            ",".join(self.queues),
            t.delivered,
            t.deadlettered,
            t.promoted,
            t.recovered,
            t.released,
            t.dead,
            self.dispatcher.sent,
        )
