"""The worker's claiming loop and the state it owns (docs/explanation/house.md,
"runners/"); ``worker.py`` documents the behaviour and builds one ``ClaimLoop``."""

from __future__ import annotations

import contextlib
import functools
import logging
import queue as _queue
import secrets
import threading
import time

from ..core.claims import Claims
from .direct import FREED, Direct, hold_ride
from .dispatcher import kinds_connected
from .flusher import Flusher
from .outage import REDIS_DOWN, Outage
from .pool import HandlerPool, JobConnections, run_handler
from .reporter import Finished, Reporter
from .timeouts import Timeouts, timed_out
from .wake import Idle, Inbox, Linger, Wake

log = logging.getLogger("echomq_django.worker")


class ClaimLoop:
    """The loop a ``Worker`` runs, with every piece of state it keeps.

    ``mq``: the ``EchoMQ``; ``queues``: queue names; ``concurrency``: handler threads;
    ``batch``: most jobs per claim; ``leases``: ``{queue: lease ms}``; ``time_limits``:
    ``{queue: TIMEOUT_MS or None}``; ``max_stuck``: handler threads written off before the loop
    stops; ``shutdown_timeout`` (s): how long a stop waits for running jobs; ``block_s``,
    ``sweep_s``, ``max_stalls``: the wake-ups and timers (``wake.Idle``); ``sender``: the
    signals' sender (the worker); ``metrics``: the process's counters or None; ``make_pool(loop,
    name)``: builds each run's pool (None: handler threads, ``HandlerPool``).

    Parts: ``claims`` (``Claims``), ``reporter`` (``Reporter``), ``timeouts`` (``Timeouts``),
    ``idle`` (``wake.Idle``), and per run ``pool`` and ``done`` (finished jobs and wake-ups for
    the loop). ``run(burst, max_jobs)`` claims round-robin, submits to the pool, waits and hands
    finished jobs to the reporter; ``stop(force)`` ends it from any thread.
    """

    def __init__(
        self,
        mq,
        queues: list[str],
        *,
        concurrency: int,
        batch: int,
        leases: dict[str, int],
        time_limits: dict[str, int | None],
        max_stuck: int,
        shutdown_timeout: float,
        block_s: float,
        sweep_s: float,
        max_stalls: int,
        sender,
        metrics=None,
        make_pool=None,
    ) -> None:
        self.mq, self.queues = mq, queues
        self.concurrency, self.batch, self.leases = concurrency, batch, leases
        self.time_limits, self.max_stuck = time_limits, max_stuck
        self.shutdown_timeout, self.claims = shutdown_timeout, Claims()
        self.writes = Flusher(mq, metrics=metrics)  # its handlers' progress and log writes
        self.reporter = Reporter(mq, sender, self.claims.forget, self.on_released,
                                 lambda: self.done.put(None), metrics=metrics, writes=self.writes,
                                 fetch=self.fetch, taken=self._taken,
                                 holds=lambda job: self.direct.holds_sibling(job))  # fmt: skip
        # the reporter's claims in flight, their tokens (this run's, until _take), the loop's
        self.fetching, self._fetch_lock, self._tokens, self.claiming = 0, threading.Lock(), {}, 0
        self.ride_held: str | None = None  # the token of a slot held for a riding claim
        self.timeouts = Timeouts(lambda job, limit_ms: timed_out(self, job, limit_ms))
        self.idle = Idle(self, block_s, sweep_s, max_stalls)
        self.linger = Linger()  # waits for a finished job's batch-mates (wake.py)
        self.pool: HandlerPool | None = None
        self.make_pool = make_pool  # (loop, name) -> a pool; None: HandlerPool
        self.scale = None  # an autoscale.Autoscale: concurrency moves within its bounds
        self.commands = None  # a commands.Commands: operator commands, applied here
        self.done = Inbox()  # Finished, Wake, None: a wake-up
        self.waiting = False  # blocked on the wake keys, idle
        self.executing = 0  # submitted to the pool and not finished (loop thread only)
        self.claimed, self.retry_at = 0, 0.0  # this run's claims; in an outage, the next try
        self.stopping = threading.Event()
        self.forced, self.max_jobs = False, None
        self.stop_at = 0.0  # a stop's deadline (monotonic)
        self.give_up_stuck = False  # more stuck than max_stuck: a stop does not wait for them
        self.rest = dict.fromkeys(queues, 0.0)  # queue -> when it may be claimed (monotonic)
        # queue -> parents this worker saw released on it (written by the reporter only): a
        # claim that came back short rests its queue only if none was released meanwhile
        self.released = dict.fromkeys(queues, 0)
        self.lost_claims: dict[str, list] = {}  # queue -> [(token, yields_to)]: claims that raised
        self._pairs: dict[str, tuple[str, str]] = {}  # token in flight -> (queue, token) ditto
        # queues whose last claim met a full RATE_LIMIT window: a burst waits it out
        self.limited: set[str] = set()
        self.turn = self.window_waits = 0  # window_waits: claims that met a full window
        self.warned: set[str] = set()  # job names without a handler, warned about once
        self.connections = JobConnections()  # Django's rule around each job, per thread
        self.subscribed = False  # event kinds with receivers here recorded for our queues
        self.direct = Direct(self)  # a handler thread's own report (direct.py)

    def stop(self, force: bool = False) -> None:
        """Stop claiming; ``run()`` returns once the running jobs are reported (or
        ``shutdown_timeout`` s); ``force``: at once. Safe from any thread and a signal handler."""
        if not self.stopping.is_set():
            self.stop_at = time.monotonic() + self.shutdown_timeout
            self.stopping.set()
        self.forced = self.forced or force
        self.done.put(None)  # wake the loop

    def _held(self) -> bool:
        """Lost claims only, no new ones: stopping, or the reporter in an outage."""
        return self.stopping.is_set() or self.reporter.down

    def drain(self) -> None:
        """Stop claiming; ``run()`` returns once every running job has
        finished, with no deadline (a stop already under way keeps its own)."""
        if not self.stopping.is_set():
            self.stop_at = float("inf")
            self.stopping.set()
        self.done.put(None)

    def begin(self, name: str) -> None:
        """Start a run: a fresh pool of handler threads named ``name``, a fresh queue of
        finished jobs (handlers an earlier run abandoned post to the old one), the waker on it."""
        if self.make_pool is None:
            self.pool = HandlerPool(self.concurrency, name, functools.partial(run_handler, self))
        else:
            self.pool = self.make_pool(self, name)
        with self._fetch_lock:  # slots an earlier run held (a stop cut it short) are not held
            self.done, self._tokens, self._pairs = Inbox(), {}, {}
            self.fetching = self.claiming = 0
        self.executing, self.ride_held = 0, None
        self.reporter.reset()
        self.writes.reopen()
        self.rest = dict.fromkeys(self.queues, 0.0)
        self.limited.clear()
        self.idle.start(self.done.put)
        self.timeouts.reopen()

    def end(self) -> int:
        """After a run: the waker stops (a marker it pops from now on goes back), the reporter
        and the time limits close. Returns how many jobs are claimed and unreported (left to
        their leases)."""
        self.waiting = False
        self.idle.stop()
        self.reporter.close()
        self.writes.close()
        self.timeouts.close()
        return len(self.claims)

    def shut_pool(self, abandoned: int) -> None:
        """Shut the handler pool, waiting for its threads only when no job
        was abandoned and none is stuck; log the last throughput line; the
        stop request is spent."""
        self.pool.shutdown(wait=not abandoned and not self.timeouts.stuck)
        self.reporter.log_stats(time.monotonic(), self.queues)
        self.stopping.clear()
        self.forced = self.give_up_stuck = False

    def run(self, burst: bool, max_jobs: int | None) -> None:
        """The claiming loop (between ``begin`` and ``end``). A burst first promotes the
        delayed jobs already due on each queue: "until nothing is pending or due", even
        while another worker's timers lock holds the sweeps off."""
        if burst:
            with contextlib.suppress(*REDIS_DOWN):  # the loop meets the outage, waits it out
                for queue in self.queues:
                    self.mq.timers.promote_delayed(queue)
        self._loop(burst, max_jobs)

    def _loop(self, burst: bool, max_jobs: int | None) -> None:
        """The claiming loop, as named steps: claim if there is room, stop when
        the run is over, else wait for a finished job and hand it over to the
        reporter (which reports it while the loop claims again)."""
        outage = Outage(self.mq.client, log)
        self.claimed, self.retry_at, self.max_jobs = 0, 0.0, max_jobs
        self.reporter.start_stats(time.monotonic())
        while not self.forced:
            now = time.monotonic()
            got, asked = self._claim_if_room(now, burst, max_jobs, outage)
            if self._run_is_over(now, got, asked, max_jobs):
                return
            if now >= self.reporter.stats_at:
                self.reporter.log_stats(now, self.queues)
            if got and self.executing < self.room and not asked:
                continue  # a queue gave all we asked: there may be more right away
            self._wait_and_hand_over(self._next_wait(now, max_jobs))

    def _claim_if_room(
        self, now: float, burst: bool, max_jobs: int | None, outage: Outage
    ) -> tuple[int, bool]:
        """Claim as many jobs as there are free handler threads (within ``max_jobs``; those the
        reporter holds aside), unless in an outage, or held (``_held``: lost claims sent again
        only). Returns how many, and whether every queue was asked (a burst's last look)."""
        limit = self.concurrency if max_jobs is None else max_jobs - self.claimed - self.fetching
        if now < self.retry_at or (self._held() and not self.lost_claims):
            return 0, False
        free = min(self.room - self.executing - self.fetching, limit)
        asked = burst and not self.executing and not self.reporter.unreported
        try:
            if outage.down:  # a retry asks Redis first: silence is not a recovery
                self.mq.ping()
            timed = self.idle.keep_timers()
            got = self._claim(free, everywhere=asked) if free > 0 else 0
        except REDIS_DOWN as err:
            self.retry_at = now + outage.failed(err)
            return 0, False
        self.retry_at = 0.0
        if outage.down or free > 0 or timed:
            outage.ok()
        if self.scale is not None:
            self._rescale(now, free, got)
        return got, asked

    def _rescale(self, now: float, free: int, got: int) -> None:
        """Autoscaling (autoscale.py): the pool's new size, if it changes."""
        size = self.scale.size(now, self.concurrency, free, got, self.executing)
        if size != self.concurrency:
            log.info("autoscale: %d -> %d handlers", self.concurrency, size)
            self.resize(size)

    def resize(self, size: int) -> None:
        """Run ``size`` handlers from now on (autoscaling, a pool command)."""
        self.concurrency = size
        self.pool.resize(size)

    def _run_is_over(self, now: float, got: int, asked: bool, max_jobs: int | None) -> bool:
        """True when ``run()`` should return: stopping (or ``max_jobs`` claimed, or a burst that
        found every queue empty) with nothing running, unreported, held by the reporter's claims
        or (a stop) lost, written-off handlers included (their threads still run their side
        effects: waited for up to ``shutdown_timeout``, a run that ends on its own becoming a stop
        for that deadline, unless more than ``max_stuck``); or the shutdown timeout passed.
        docs/explanation/reliability.md#stopping-a-worker"""
        lost = self.lost_claims and self.stopping.is_set()
        if not self.executing and not self.reporter.unreported and not self.fetching and not lost:
            over = self.stopping.is_set() or (max_jobs is not None and self.claimed >= max_jobs)
            # burst: every queue empty or paused (a full RATE_LIMIT window still has jobs: wait)
            over = over or (asked and got == 0 and not self.limited)
            if over:
                if not self.timeouts.stuck or self.give_up_stuck:
                    return True
                if not self.stopping.is_set():
                    self.stop()  # no more claims; wait for the written-off handlers
        return self.stopping.is_set() and now >= self.stop_at

    def _next_wait(self, now: float, max_jobs: int | None) -> float:
        """Seconds to wait for a finished job or a wake-up: until the next try in an outage, else
        the next timer; never past the shutdown deadline. With a free slot (not one held for a
        claim riding a completion: its reply wakes the loop anyway) and ``max_jobs`` not reached,
        the waker blocks on the wake keys meanwhile; else it leaves the markers to others."""
        room = max_jobs is None or self.claimed < max_jobs
        idle = not self.retry_at and not self._held() and room
        free = self.executing + self.fetching < self.concurrency
        self.waiting = self.idle.block(idle and free)
        resting = [at - now for at in self.rest.values() if now < at < float("inf")]
        if self.scale is not None:  # an idle pool shrinks on time (autoscale.py)
            resting.append(self.scale.next_in(now, self.concurrency))
        wait = self.retry_at - now if self.retry_at else min([self.idle.timers.next_in(), *resting])
        wait = max(0.0, wait)
        if self.stopping.is_set():
            wait = min(wait, max(0.0, self.stop_at - now))
        return wait

    def _wait_and_hand_over(self, timeout: float) -> None:
        """Block until a job finishes (or ``timeout`` s, or a wake-up), wait for its
        batch-mates while ``linger`` says so (not past ``timeout``, not after a
        wake-up or a stop), then hand every finished job to the reporter."""
        end = time.monotonic() + timeout  # no wait for batch-mates past it
        try:
            item = self.done.get(timeout=timeout)
        except _queue.Empty:
            return
        finished, wakes, freed = [], [], 0
        self.linger.begin(end)
        while True:
            if isinstance(item, Wake):
                wakes.append(item)
            elif item is FREED:
                freed += 1
            elif isinstance(item, tuple):
                self._take(*item)
            elif item is not None:
                finished.append(item)
            try:
                item = self.done.get_nowait()
            except _queue.Empty:
                if wakes or self.stopping.is_set():
                    break
                try:  # a batch-mate, while the wait lasts
                    item = self.linger.more(self.done, finished, freed, self.executing, self.room)
                except _queue.Empty:
                    break
        self.executing -= freed
        if finished:
            self.executing -= len(finished)
            self.reporter.hand_over(finished, self._hold_ride(finished))
            for queue in {f.job.queue for f in finished}:  # their queue's next sweep prunes
                self.idle.timers.finished(queue)
        for wake in wakes:  # after the finished jobs freed their threads
            if wake.command:
                self.commands.apply(wake)
            else:
                self.idle.on_wake(wake)

    def _hold_ride(self, finished: list[Finished]) -> tuple | None:
        """``direct.hold_ride``, one at a time (``ride_held``: the token of the slot held)."""
        held = None if self.ride_held else hold_ride(self.fetch, finished, self.cross)
        self.ride_held = held[1][2] if held else self.ride_held
        return held

    # jobs it takes at once: a handler each, and what the pool queues beyond (processes)
    room = property(lambda self: self.concurrency + getattr(self.pool, "ahead", 0))
    cross = property(lambda self: self.mq.cross_queue_scripts)

    def fetch(self, queue: str, yields_to: tuple | None = None, last: bool = False) -> tuple | None:
        """(Reporter thread) ``(1, lease ms, token)``: room for a job of ``queue`` claimed with a
        completion, its slot held until ``_take`` (``yields_to``: ``(queue, token)`` of the claim
        whose slot, the last free one, it shares; ``last``: only when that slot is the last free
        one); None: none free, held (``_held``), ``max_jobs``, or a lost claim the loop sends
        again first (its jobs may be leased already)."""
        with self._fetch_lock:
            used = self.executing - self.direct.spare() + self.fetching
            full = used >= self.room
            if last and used + 1 < self.room:  # other slots free: the loop claims for them
                return None
            taken = self.claimed + self.fetching + self.claiming  # the loop's claim in flight too
            done = bool(self.lost_claims) or (self.max_jobs is not None and taken >= self.max_jobs)
            done = done or self._held() or self.retry_at or queue not in self.rest
            if full != (yields_to is not None) or done:  # shared: only into the last free slot
                return None
            self._tokens[token := secrets.token_hex(8)] = held = 0 if yields_to else 1
            self.fetching += held
            if yields_to:  # each yields to the other, sent again too (lua/claim.lua KEYS[4])
                self._pairs[token], self._pairs[yields_to[1]] = yields_to, (queue, token)
        return 1, self.leases[queue], token

    def _taken(self, queue: str, token: str, claimed) -> None:
        """(Reporter thread) what its claim gave, for the loop: the slot held
        passes to the jobs taken (none: freed), until ``_take`` starts them."""
        if self.direct.took(queue, token, claimed):
            return  # its job runs on the thread that reported (direct.py)
        with self._fetch_lock:
            if token in self._tokens:  # an earlier run's claim is left to its leases
                got = 0 if isinstance(claimed, BaseException) else len(claimed)
                self.fetching += got - self._tokens[token]
                self.done.put((queue, token, claimed))

    def _take(self, queue: str, token: str, claimed) -> None:
        """The reporter's claim: run its jobs; one that raised is replayed."""
        if token == self.ride_held:  # ridden on, or freed: the next hand-over may hold one
            self.ride_held = None
        with self._fetch_lock:
            self._tokens.pop(token, None)
            self.fetching -= 0 if isinstance(claimed, BaseException) else len(claimed)
            yields_to = self._pairs.pop(token, None)
            if not isinstance(claimed, BaseException):
                self.claimed += len(claimed)  # under the lock: the direct path counts too
        if isinstance(claimed, REDIS_DOWN):  # it may have run: its jobs are leased to us
            self.lost_claims.setdefault(queue, []).append((token, yields_to))  # sent first
        elif not isinstance(claimed, BaseException):
            self.claims.add(claimed)
            self.executing += len(claimed)
            for job in claimed:
                self.pool.start(job, self.done)

    def on_released(self, queue: str) -> None:
        """The reporter saw a parent released on ``queue``: claim there now."""
        if queue in self.rest:
            self.released[queue] += 1
            self.rest[queue] = 0.0

    def _claim(self, free: int, everywhere: bool) -> int:
        """Claim up to ``free`` jobs round-robin over the queues and submit
        them; ``everywhere`` asks resting queues too. Returns how many."""
        # before any transition of ours (docs/explanation/signals.md#what-it-costs)
        if not self.subscribed:
            self.mq.signal_events.subscribe(self.queues, kinds_connected())
            self.subscribed = True
        got, now, n = 0, time.monotonic(), len(self.queues)
        first, self.turn = self.turn, (self.turn + 1) % n
        # every lost claim first, resting queue or not (its jobs were leased for our room)
        order = [queue for queue, lost in self.lost_claims.items() for _ in lost]
        for queue in order + [self.queues[(first + i) % n] for i in range(n)]:
            lost = self.lost_claims.get(queue)
            if free <= 0 or (self._held() and not lost):
                break  # a stop (or the reporter's outage) sends only the lost claims again
            if not lost and self.rest[queue] > now and (not everywhere or queue in self.limited):
                continue  # resting; a burst's last look skips a window known full too
            with self._fetch_lock:  # reserved against the reporter's fetch (max_jobs)
                cap = float("inf") if self.max_jobs is None else self.max_jobs
                self.claiming = want = min(free, self.batch, cap - self.claimed - self.fetching)
            if want <= 0:
                break
            released = self.released[queue]
            # a lost token again, yielding as it was sent (lua/claim.lua KEYS[4]), or a new one
            token, yields = lost.pop(0) if lost else (secrets.token_hex(8), None)
            if lost == []:
                del self.lost_claims[queue]
            try:
                jobs = self.mq.claim(queue, want, self.leases[queue], token=token, yields_to=yields)
            except REDIS_DOWN:
                # Redis may have run it and lost only the reply: the next try sends the
                # same token, and a claim that ran gives its jobs back (lua/claim.lua's
                # replay) instead of leaving them active and unseen until their lease ends
                self.lost_claims.setdefault(queue, []).insert(0, (token, yields))
                self.claiming = 0
                raise
            with self._fetch_lock:  # counted, then freed (the direct path counts too)
                self.claimed, self.claiming = self.claimed + len(jobs), 0
            if jobs.wait_ms:  # its RATE_LIMIT window is full: rest until it opens
                self.rest[queue] = now + jobs.wait_ms / 1000
                self.limited.add(queue)
                self.window_waits += 1
                continue
            self.limited.discard(queue)
            short = len(jobs) < want and self.released[queue] == released
            if short and queue not in self.lost_claims:
                # drained or paused: rest until woken (not if a parent was released since it ran)
                self.rest[queue] = float("inf")
            self.claims.add(jobs)
            self.executing += len(jobs)
            for job in jobs:
                job._writes = self.writes
                self.pool.start(job, self.done)
            free -= len(jobs)
            got += len(jobs)
        return got
