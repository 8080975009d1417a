"""The pump: the per-queue sweep (DESIGN §6).

One ``Pump(queues).sweep()`` pass, for each queue:

1. delivers its outbox (cross-queue fan-in): read without removing (LRANGE),
   deliver each entry with ``deliver_to_parents`` on its parent's slot, then
   ``trim_outbox`` removes exactly the delivered prefix. A crash between
   deliver and trim re-delivers, which the scripts' guards make a no-op. The
   sweep holds a lock and the trim checks it, so two pumps on one queue never
   trim what the other has not delivered. The lock is a short lease
   (``lock_ms``, 2 s by default) renewed after every batch and dropped at
   the end of the sweep; it holds the pump's own token for the pump's whole
   life, so a pump whose drop failed while Redis was away (or whose lock came
   back from an AOF) takes it up again at its next sweep, and a live peer
   takes over within ``lock_ms`` of a pump that died mid-sweep (issue 17,
   item 2). An entry whose
   parent is gone is retried on ``max_tries`` sweeps (moved to the back of
   the outbox meanwhile, so it never holds up the entries behind it), then
   moved to the dead-letter list with its reason; a
   malformed (poison) entry is dead-lettered at once with what is wrong with
   it: the pump never dies of data;
2. promotes due delayed jobs;
3. recovers expired leases (a job past the stall limit dies);
4. sends the Django signals of the queue's durable events (``dispatch.py``,
   DESIGN §10.6): in ``sweep()`` synchronously, in ``run()`` from the
   dispatcher's threads, which block on the queues' event streams and send
   within milliseconds of a transition.

``Pump.run`` sweeps every ``interval`` seconds and, in between, blocks on its
queues' outbox wake keys (``P:{q}:flow:wake``, wake.py): a child's
completion or death that writes an outbox entry wakes it, and it delivers
that queue's outbox at once, so a cross-queue parent is released within
milliseconds of its last child (DESIGN §10.1). The interval sweep stays as
the safety net (a wake-up lost with a killed pump; promotion and recovery
where no worker keeps the timers).
"""

from __future__ import annotations

import logging
import queue as _queue
import secrets
import threading
import time
from dataclasses import dataclass, field

from ..conf import get_mq
from ..core.exceptions import RedisUnavailable, SweepLockLost
from ..core.jobs import Outcome
from ..core.keyspace import validate_queue, whole_number
from ..protocol.client import EchoMQ
from ..protocol.errors import TRANSIENT, connection_error
from . import heartbeat as registry
from .delivery import deliver_batch
from .dispatcher import Dispatcher
from .outage import Outage
from .periodic import Scheduler
from .wake import BLOCK_S, Wake, Waker

log = logging.getLogger("echomq_django.pump")

SUMMARY_EVERY_S = 10.0  # seconds between the INFO lines of running totals
LOCK_MS = 2000  # the sweep lock's lease (ms): how soon a peer takes over from a dead pump
LOCK_MS_MIN = 100  # shorter leases could lapse between a batch's round trips
LOCKED_RETRY_S = 0.05  # a woken queue whose outbox another pump holds: look again then
STOP_CHECK_S = 0.25  # run() calls should_stop() at least this often (a local check)


@dataclass
class SweepReport:
    """What one sweep of one queue did (counts)."""

    delivered: int = 0
    deadlettered: int = 0
    promoted: int = 0
    recovered: int = 0
    released: int = 0
    dead: int = 0
    signals: int = 0  # durable events whose signals this sweep sent
    expired: int = 0  # parents whose children_timeout_ms passed (DESIGN §10.3)
    scheduled: int = 0  # periodic jobs fired on this queue (DESIGN §10.3)
    pruned: int = 0  # rows retention, removals and cancels took (DESIGN §10.2)
    locked: bool = False
    lock_lost: bool = False
    # entries delivered to a Cluster master whose replica did not confirm them
    # in time: kept in the outbox for a later sweep (Scripts.run_many_confirmed)
    unreplicated: int = 0
    outcome: Outcome = field(default_factory=Outcome, repr=False)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "outcome"}


def deliver_outbox(
    mq: EchoMQ,
    queue: str,
    batch: int = 500,
    lock_ms: int = LOCK_MS,
    max_tries: int = 3,
    report: SweepReport | None = None,
    before_trim=None,
    token: str | None = None,
) -> SweepReport:
    """Deliver ``queue``'s outbox, ``batch`` entries per round, until the
    entries it held when the sweep began were each looked at once: an entry
    whose parent is not found moves to the back (``trim_outbox``) and is
    tried again at a later sweep, up to ``max_tries`` deliveries, then
    dead-lettered; it never holds up the entries behind it. Skips (``locked=True``)
    when another pump holds the sweep lock of this queue. ``token``: the
    caller's lock token (a ``Pump`` keeps one for its life; None: a fresh
    one); ``lock_ms`` (ms): the lock's lease, renewed after each batch.
    ``before_trim(queue, actions)`` runs between delivery and trim: the kill
    point tests use it."""
    report = report or SweepReport()
    token = token or secrets.token_hex(8)
    if not mq.outbox_lock(queue, token, lock_ms):
        report.locked = True
        return report
    try:
        # each entry found when the sweep began is looked at once: one moved to
        # the back waits for a later sweep (the length is read only when the
        # first batch comes back full)
        left: int | None = None
        while left is None or left > 0:
            asked = batch if left is None else min(batch, left)
            raw = mq.outbox_head(queue, asked)
            if not raw:
                break
            if left is None:
                left = len(raw) if len(raw) < batch else mq.outbox_length(queue)
            entries, verdicts = deliver_batch(mq, raw, report.outcome, queue)
            if None in verdicts:
                # a failover now would take those deliveries back: the entries
                # from the first of them stay for a later sweep (a second
                # delivery of an entry is a no-op)
                keep = verdicts.index(None)
                report.unreplicated += len(raw) - keep
                log.warning(
                    "outbox of %s: %d deliveries not confirmed on a replica in time; "
                    "kept for the next sweep",
                    queue,
                    len(raw) - keep,
                )
                # the prefix before it is trimmed below; left = keep ends the sweep there
                raw, entries, verdicts, left = raw[:keep], entries[:keep], verdicts[:keep], keep
            actions, read = [], []
            for item, entry, verdict in zip(raw, entries, verdicts, strict=True):
                read.append(item)
                if verdict is True:
                    actions.append("ok")
                    continue
                if isinstance(verdict, str):  # poison: no later try can deliver it
                    log.error("outbox of %s: dead-lettering an entry: %s", queue, verdict)
                    actions.append(verdict)
                    continue
                tries = mq.count_delivery(queue, item)
                if tries < max_tries:
                    actions.append("again")  # to the back: a later sweep tries it again
                    continue
                actions.append(
                    f"parent {entry.get('q')}/{entry.get('p')} not found after {tries} deliveries"
                )
            if before_trim is not None:
                before_trim(queue, actions)
            removed = 0
            if actions:
                try:
                    removed = mq.trim_outbox(queue, token, read, actions)
                except SweepLockLost:
                    # our lock expired mid-sweep and another pump may be trimming:
                    # leave the outbox to it; what we delivered is re-delivered as no-ops
                    log.warning(
                        "pump lock on %s expired before the trim; leaving the "
                        "outbox to the pump that holds it",
                        queue,
                    )
                    report.lock_lost = True
                    break
                if removed != len(actions):  # the head moved under us: re-read it
                    log.warning("outbox of %s changed before the trim; re-reading", queue)
                    continue
            report.delivered += actions.count("ok")
            report.deadlettered += len(actions) - actions.count("ok") - actions.count("again")
            left -= len(raw)
            if len(raw) < asked or left <= 0:
                break
            if not mq.outbox_lock(queue, token, lock_ms):  # renew for the next batch
                log.warning("pump lock on %s expired during the sweep", queue)
                report.lock_lost = True
                break
    finally:
        try:
            mq.outbox_lock(queue, token, lock_ms, take=False)
        except RedisUnavailable:  # it expires; and it is ours at our next sweep
            log.warning("pump lock on %s not dropped: Redis is unavailable", queue)
    return report


def check_interval(interval) -> float:
    """``interval`` if it is a number of seconds > 0; ``ValueError`` naming
    the rule otherwise (an interval of 0 sweeps without a pause: a core spins)."""
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
    return interval


class Pump:
    """Sweeps queues: ``Pump(["orders"], mq=None).sweep()`` (DESIGN §7).

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
    runs (a heartbeat every ``beat_s`` seconds, DESIGN §10.5);
    ``dispatcher``: the ``Dispatcher`` of the queues' durable signals (None:
    one with the settings' tries and backoff).
    Raises ``ValueError`` naming the rule for a bad or missing queue name
    or a ``batch`` (>= 1), ``lock_ms``, ``max_tries``, ``max_stalls`` out of
    range (issue 17, item 7).
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
        beat_s: float = registry.HEARTBEAT_S,
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
        self._posted: _queue.SimpleQueue = _queue.SimpleQueue()  # Wake, or None: stop
        self._stopped = threading.Event()  # stop(): ends an outage backoff at once

    def sweep(self) -> dict[str, dict]:
        """One pass over every queue; returns ``{queue: counts}`` (see
        ``SweepReport``). Raises ``RedisUnavailable`` when Redis is down."""
        try:
            return self._sweep()
        except TRANSIENT as err:
            raise connection_error(self.mq.client, err) from err

    def _sweep(self) -> dict[str, dict]:
        reports = {}
        self.dispatcher.subscribe()  # before this sweep's transitions
        fired = self.scheduler.fire_due() if self.scheduler else []
        for queue in self.queues:
            rep = self._deliver_outbox(queue)
            rep.promoted = self.mq.promote_delayed(queue, limit=self.batch * 10)
            stalled = self.mq.recover_stalled(
                queue, limit=self.batch * 10, max_stalls=self.max_stalls
            )
            rep.recovered = stalled.recovered
            rep.outcome.merge(stalled)
            rep.expired, expired = self.mq.expire_children(queue, limit=self.batch * 10)
            rep.outcome.merge(expired)
            pruned = self.mq.prune(queue)  # bounded: MAX_CALLS steps of BUDGET units
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
        try:
            rep = self._deliver_outbox(queue)
        except TRANSIENT as err:
            raise connection_error(self.mq.client, err) from err
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
        beat = registry.announce(
            self.mq,
            "pump",
            self.queues,
            register=self.register,
            beat_s=self.beat_s,
            status=lambda: {"jobs_done": t.delivered + t.promoted + t.recovered},
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
            if self.scheduler:  # wake for the next periodic tick (DESIGN §10.3)
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
            "pump %s: delivered %d, dead-lettered %d, promoted %d, recovered %d, "
            "released %d, dead %d, signals %d",
            ",".join(self.queues),
            t.delivered,
            t.deadlettered,
            t.promoted,
            t.recovered,
            t.released,
            t.dead,
            self.dispatcher.sent,
        )
