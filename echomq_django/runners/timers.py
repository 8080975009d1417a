"""A worker's timers (docs/explanation/house.md, "runners/"; the markers and
the commands they run are ``protocol/timers.py``'s, the waits between them
``runners/wake.py``'s).

``Timers``: the timers a worker keeps for its queues, so ``runworker``
alone runs a site (periodic jobs aside): it promotes due delayed jobs at
their run-at (learnt from ``'d'`` markers and from its sweeps); it
recovers expired leases one millisecond past the earliest lease deadline
it read, or a lease after its last look when nothing was active (a job
leased later expires no sooner), so a dead worker's job is back within a
second of its deadline (docs/explanation/reliability.md#leases-and-recovery);
it kills held parents at their ``children_timeout_ms`` deadline; and
every ``sweep_s`` seconds it looks whether its queues hold anything to
watch (``mq.timers.busy``: one command for all of them on one server).
A queue that holds nothing gets no timer until the next look, within a
lease. For one that does, the first worker to take the queue's short
lock (``P:{q}:timers:lock``, it expires, never released: at most one
sweep per queue per interval however many workers run) reads the next
delayed run-at, lease and children deadlines, re-wakes a queue that has
pending jobs (a marker lost with a killed worker costs at most one
interval), and prunes when this worker finished jobs there since its
last prune or work waits in the queue's lists. The recovery and expiry
scripts move only what is past due, atomically, so workers firing
together move each job once.
"""

from __future__ import annotations

import logging
import secrets
import time

from ..core.jobs import Outcome

log = logging.getLogger("echomq_django.wake")

SWEEP_S = 10.0  # a queue's sweep interval (s): lease recovery, next run-at, lost markers
OWN_LOOK_MS = 250  # ms between looks while the worker's own held leases are past (an outage)


def said_recovered(logger: logging.Logger, queue: str, stalled) -> None:
    """One WARNING on ``logger`` when ``stalled`` (``recover_stalled``'s
    ``Outcome`` for ``queue``) moved a job: a worker died or lost Redis while
    it ran (docs/explanation/reliability.md#leases-and-recovery). The
    recovery is atomic: the worker or pump that moved a job says it once."""
    if stalled.recovered or stalled.dead:
        logger.warning(
            "queue %s: %d job(s) whose lease expired taken back to run again, %d job(s) dead "
            "in the recovery (past the stall limit, cancelled while they ran, or failed by "
            "them) (docs/explanation/reliability.md#leases-and-recovery)",
            *(queue, stalled.recovered, len(stalled.dead)),
        )


class Timers:
    """A worker's timers for ``queues`` (see the module): ``learn(queue,
    run_at_ms)`` a delayed run-at; ``next_in()`` seconds until the next timer;
    ``run()`` fires what is due and returns the merged ``Outcome`` (recovered
    jobs that died and what that moved; their signals are durable events).

    ``sweep_s`` (s): sweep interval per queue; ``max_stalls``: lease expiries a
    job survives (as the pump's); ``limit``: most jobs moved per script call;
    ``leases``: ``{queue: lease ms}`` this worker claims with (default each
    queue's ``LEASE_MS``): the soonest a job leased after a look at the
    active set can expire, so the next look comes no later
    (docs/explanation/reliability.md#leases-and-recovery).
    ``finished(queue)``: this worker finished a job there, so the queue's
    next sweep prunes; ``settled()`` (default always true): whether every
    job it finished is written (a prune before that is not counted as
    done); ``own_past(queue)`` (default never): whether this worker holds a
    job of ``queue`` whose lease deadline has passed (an outage longer than
    the lease kept its heartbeat from extending it): the recovery waits,
    looking every ``OWN_LOOK_MS``, for the heartbeat to extend it or the
    reporter to report it, a third of a lease at most, so the worker does
    not take back, and run again, a job it holds
    (docs/explanation/reliability.md#unreported-jobs-keep-their-leases).
    Counters: ``promoted``, ``recovered``, ``expired``, ``sweeps``,
    ``looks`` (queues found with nothing to watch), ``prunes``.
    Redis errors propagate (the worker waits an outage out).
    """

    def __init__(
        self,
        mq,
        queues,
        *,
        sweep_s: float = SWEEP_S,
        max_stalls: int = 1,
        limit=1000,
        leases: dict[str, int] | None = None,
        settled=None,
        own_past=None,
    ):
        if not 0 < sweep_s < float("inf"):  # nan and inf too
            raise ValueError(f"sweep_s must be a finite number > 0 s, got {sweep_s!r}")
        self.mq, self.queues = mq, list(queues)
        self.sweep_s, self.max_stalls, self.limit = float(sweep_s), max_stalls, limit
        leases = leases or {}
        # the shortest lease a job of the queue can have: this worker's, or the setting
        self.leases = {
            q: min(int(leases.get(q) or mq.setting(q, "LEASE_MS")), int(mq.setting(q, "LEASE_MS")))
            for q in self.queues
        }
        self.due: dict[str, int | None] = dict.fromkeys(self.queues)  # earliest run-at (ms)
        # ms: the next look for expired leases (None: at the next sweep), and the
        # earliest children deadline known (None: none known)
        self.lease_at: dict[str, int | None] = dict.fromkeys(self.queues)
        self.expire_at: dict[str, int | None] = dict.fromkeys(self.queues)
        self.sweep_at = dict.fromkeys(self.queues, 0.0)  # monotonic time of the next sweep
        self.token = secrets.token_hex(8)
        self.unpruned: set[str] = set()  # queues this worker finished jobs on since it pruned
        self.settled = settled or (lambda: True)
        self.own_past = own_past or (lambda queue: False)
        self.own_since: dict[str, int] = {}  # queue -> ms its recovery was first held off
        self.promoted = self.recovered = self.expired = self.sweeps = 0
        self.looks = self.prunes = 0  # sweeps skipped for a queue found idle; prunes run

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
        for timer in (self.due, self.lease_at, self.expire_at):
            waits += [(at - ms) / 1000 for at in timer.values() if at is not None]
        return max(0.0, min(waits))

    def finished(self, queue: str) -> None:
        """This worker finished a job of ``queue``: its next sweep prunes."""
        if queue in self.sweep_at:
            self.unpruned.add(queue)

    def run(self) -> Outcome:
        outcome = Outcome()
        now = time.monotonic()
        sweeping = [q for q in self.queues if self.sweep_at[q] <= now]
        # one look for the idle ones first: a queue with nothing to watch, where this
        # worker finished nothing, costs no sweep (Timers.busy)
        looked = [q for q in sweeping if q not in self.unpruned]
        busy = self.mq.timers.busy(looked) if looked else set()
        for queue in self.queues:
            ms = self.mq.clock()
            due = self.due[queue]
            if due is not None and due <= ms:
                self._promote(queue)
            if queue in sweeping:
                if queue in busy or queue in self.unpruned:
                    self._sweep(queue, outcome)
                else:
                    self._quiet(queue)
                continue
            if self.lease_at[queue] is not None and self.lease_at[queue] <= ms:
                self._recover(queue, outcome)
            if self.expire_at[queue] is not None and self.expire_at[queue] <= ms:
                self._expire(queue, outcome)
        return outcome

    def _promote(self, queue: str) -> None:
        moved = self.mq.timers.promote_delayed(queue, limit=self.limit)
        self.promoted += moved
        if moved >= self.limit:
            return  # more are due: promote again on the next pass
        self.due[queue] = self.mq.timers.next_run_at(queue)

    def _recover(self, queue: str, outcome: Outcome) -> None:
        """Look at ``queue``'s earliest lease deadline and, when it has
        passed, recover the expired leases (the script moves only what has
        expired, atomically: a second worker firing at the same deadline
        moves nothing); then look again at the next deadline, or a lease
        from now, whichever comes first."""
        oldest, now = self.mq.timers.oldest_lease(queue), self.mq.clock()
        if oldest is not None and oldest < now and self.own_past(queue):
            since = self.own_since.setdefault(queue, now)
            if now - since < self.leases[queue] // 3:  # then the others' jobs go first
                self.lease_at[queue] = now + OWN_LOOK_MS
                return
        self.own_since.pop(queue, None)
        if oldest is not None and oldest < now:
            stalled = self.mq.timers.recover_stalled(
                queue, limit=self.limit, max_stalls=self.max_stalls
            )
            self.recovered += stalled.recovered
            said_recovered(log, queue, stalled)
            outcome.merge(stalled)
            oldest = self.mq.timers.oldest_lease(queue)
        self._next_lease_look(queue, oldest)

    def _next_lease_look(self, queue: str, oldest: int | None) -> None:
        # a lease deadline passes when the clock is past it (lua/recover_stalled.lua:
        # deadline < now): one ms after it. A job leased after this look expires no
        # sooner than a lease from now.
        bound = self.mq.clock() + self.leases[queue]
        self.lease_at[queue] = bound if oldest is None else min(oldest + 1, bound)

    def _expire(self, queue: str, outcome: Outcome) -> None:
        """Kill the held parents of ``queue`` past their children deadline
        (atomic, as the pump's), then learn the next deadline."""
        expired, moved = self.mq.timers.expire_children(queue, limit=self.limit)
        self.expired += expired
        outcome.merge(moved)
        self.expire_at[queue] = self.mq.timers.next_children_deadline(queue)

    def _quiet(self, queue: str) -> None:
        """``queue`` held nothing to watch at the look: no lease, deadline or
        run-at to keep. A job leased after the look expires no sooner than a
        lease from it, so the next look comes within a lease (and within
        ``sweep_s``)."""
        self.lease_at[queue] = self.expire_at[queue] = None
        self.sweep_at[queue] = time.monotonic() + min(self.sweep_s, self.leases[queue] / 1000)
        self.looks += 1

    def _sweep(self, queue: str, outcome: Outcome) -> None:
        self.sweep_at[queue] = time.monotonic() + self.sweep_s
        found = self.mq.timers.sweep(queue, self.token, int(self.sweep_s * 1000))
        prune = queue in self.unpruned and found is not None  # else: at the next sweep
        if prune and self.settled():  # what it finished is written: this prune sees it
            self.unpruned.discard(queue)
        if found is None:
            # another worker (perhaps one that died: a restart) swept this queue within
            # the interval; this one's lease and children timers fire at their
            # deadlines all the same, learnt here the first time
            if self.lease_at[queue] is None:
                self._next_lease_look(queue, self.mq.timers.oldest_lease(queue))
                self.expire_at[queue] = self.mq.timers.next_children_deadline(queue)
            return
        self.sweeps += 1
        now = self.mq.clock()
        self.due[queue] = found.next_run_at
        if found.next_run_at is not None and found.next_run_at <= now:
            self._promote(queue)
        if found.oldest_lease is not None and found.oldest_lease < now:
            self._recover(queue, outcome)
        else:
            self._next_lease_look(queue, found.oldest_lease)
        self.expire_at[queue] = found.children_deadline
        if found.children_deadline is not None and found.children_deadline <= now:
            self._expire(queue, outcome)
        if found.claimable:
            self.mq.timers.wake(queue)  # a marker may have been lost
        # retention, queued removals and cancels, bounded per sweep: only when this
        # worker finished jobs here since, or work waits (the pump prunes every sweep)
        keep_due = found.next_keep is not None and found.next_keep <= now
        if prune or found.queued or keep_due:
            outcome.merge(self.mq.lifecycle.prune(queue).outcome)
            self.prunes += 1
