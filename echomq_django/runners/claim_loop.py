"""The worker's job path (a mixin of ``worker.Worker``): the claiming loop,
the handler call on a pool thread, time-limit failures and the throughput
line (DESIGN §4, §7, §10.3). worker.py documents the behaviour; this module
was split out of it to keep modules small (issue 11), with no change.

``ClaimLoop`` keeps no state of its own: it reads and writes the attributes
``Worker.__init__`` and ``Worker.run`` set (``mq``, ``queues``, ``leases``,
``_pool``, ``_done``, ``_reporter``, ``_idle``, ``_timeouts``, ``_rest``, ...).
"""

from __future__ import annotations

import logging
import queue as _queue
import secrets
import time

from django.db import close_old_connections

from ..core.exceptions import RateLimited, Unrecoverable
from ..core.jobs import Job
from ..handlers import get_handler
from .dispatcher import kinds_connected
from .outage import REDIS_DOWN, Outage
from .pool import error_text, unknown_name_error
from .reporter import Finished
from .wake import Wake

log = logging.getLogger("echomq_django.worker")  # the worker's logger, as before the split

STATS_EVERY_S = 5.0


class ClaimLoop:
    """The worker's loop steps and job execution, mixed into ``Worker``:
    ``_loop`` claims round-robin, submits to the handler pool, waits and
    hands finished jobs to the reporter; ``_execute`` runs one handler."""

    def _loop(self, burst: bool, max_jobs: int | None) -> None:
        """The claiming loop, as named steps: claim if there is room, stop when
        the run is over, else wait for a finished job and hand it over to the
        reporter (which reports it while the loop claims again)."""
        outage = Outage(self.mq.client, log)
        self._claimed, self._retry_at = 0, 0.0
        self._stats_at = time.monotonic() + STATS_EVERY_S
        self._stats_seen = (self.processed, time.monotonic())
        while not self._force:
            now = time.monotonic()
            got, asked = self._claim_if_room(now, burst, max_jobs, outage)
            if self._run_is_over(now, got, asked, max_jobs):
                return
            if now >= self._stats_at:
                self._log_stats(now)
            if got and self._executing < self.concurrency and not asked:
                continue  # a queue gave all we asked: there may be more right away
            self._wait_and_hand_over(self._next_wait(now, max_jobs))

    def _claim_if_room(
        self, now: float, burst: bool, max_jobs: int | None, outage: Outage
    ) -> tuple[int, bool]:
        """Claim as many jobs as there are free handler threads (within
        ``max_jobs``), unless stopping or waiting out an outage. Returns how
        many, and whether every queue was asked (a burst's last look: nothing
        running or unreported)."""
        limit = self.concurrency if max_jobs is None else max_jobs - self._claimed
        if now < self._retry_at or self._stopping.is_set():
            return 0, False
        free = min(self.concurrency - self._executing, limit)
        asked = burst and not self._executing and not self._reporter.unreported
        try:
            timed = self._idle.keep_timers()
            got = self._claim(free, everywhere=asked) if free > 0 else 0
        except REDIS_DOWN as err:
            self._retry_at = now + outage.failed(err)
            return 0, False
        self._retry_at = 0.0
        if free > 0 or timed:
            outage.ok()
        return got, asked

    def _run_is_over(self, now: float, got: int, asked: bool, max_jobs: int | None) -> bool:
        """True when ``run()`` should return: stopping (or ``max_jobs``
        claimed) with nothing running or unreported; a burst that found every
        queue empty; or the shutdown timeout passed."""
        if not self._executing and not self._reporter.unreported:
            if self._stopping.is_set() or (max_jobs is not None and self._claimed >= max_jobs):
                return True
            if asked and got == 0:
                return True  # burst: every queue empty, nothing running or unreported
        return self._stopping.is_set() and now >= self._stop_at

    def _next_wait(self, now: float, max_jobs: int | None) -> float:
        """Seconds to wait for a finished job or a wake-up: until the next try
        in an outage, else the next timer; never past the shutdown deadline.
        With a free thread (and ``max_jobs`` not reached) the waker blocks
        on the wake keys meanwhile; else it leaves the markers to others."""
        room = max_jobs is None or self._claimed < max_jobs
        idle = not self._retry_at and not self._stopping.is_set() and room
        self.waiting = self._idle.block(idle and self._executing < self.concurrency)
        resting = [at - now for at in self._rest.values() if now < at < float("inf")]
        wait = (
            min([self.timers.next_in(), *resting]) if not self._retry_at else self._retry_at - now
        )
        wait = max(0.0, wait)
        if self._stopping.is_set():
            wait = min(wait, max(0.0, self._stop_at - now))
        return wait

    def _wait_and_hand_over(self, timeout: float) -> None:
        """Block until a job finishes (or ``timeout`` s, or a wake-up), then
        hand every finished job to the reporter."""
        try:
            item = self._done.get(timeout=timeout)
        except _queue.Empty:
            return
        finished, wakes = [], []
        while True:
            if isinstance(item, Wake):
                wakes.append(item)
            elif item is not None:
                finished.append(item)
            try:
                item = self._done.get_nowait()
            except _queue.Empty:
                break
        if finished:
            self._executing -= len(finished)
            self._reporter.hand_over(finished)
        for wake in wakes:  # after the finished jobs freed their threads
            self._idle.on_wake(wake)

    def _wake(self) -> None:
        """Wake the loop (from any thread)."""
        self._done.put(None)

    def _on_released(self, queue: str) -> None:
        """The reporter saw a parent released on ``queue``: claim there now."""
        if queue in self._rest:
            self._released[queue] += 1
            self._rest[queue] = 0.0

    def _claim(self, free: int, everywhere: bool) -> int:
        """Claim up to ``free`` jobs round-robin over the queues and submit
        them; ``everywhere`` asks resting queues too. Returns how many."""
        if not self._subscribed:  # before any transition of ours (DESIGN §10.6)
            self.mq.signal_events.subscribe(self.queues, kinds_connected())
            self._subscribed = True
        got, now, n = 0, time.monotonic(), len(self.queues)
        first, self._turn = self._turn, (self._turn + 1) % n
        if self._lost_claims:  # a lost claim's jobs first: they were leased for our room
            first = self.queues.index(next(iter(self._lost_claims)))
        for i in range(n):
            if free <= 0:
                break
            queue = self.queues[(first + i) % n]
            if not everywhere and self._rest[queue] > now:
                continue
            want = min(free, self.batch)
            released = self._released[queue]
            token = self._lost_claims.pop(queue, None) or secrets.token_hex(8)
            try:
                jobs = self.mq.claim(queue, want, self.leases[queue], token=token)
            except REDIS_DOWN:
                # Redis may have run it and lost only the reply: the next try
                # sends the same token, and a claim that ran gives its jobs
                # back (lua/claim.lua's replay) instead of leaving them active
                # and unseen until their lease expires
                self._lost_claims[queue] = token
                raise
            if jobs.wait_ms:  # its RATE_LIMIT window is full: rest until it opens
                self._rest[queue] = now + jobs.wait_ms / 1000
            elif len(jobs) < want and self._released[queue] == released:
                # drained (or paused): rest until woken; a parent this worker
                # saw released after the claim ran is claimed at once instead
                self._rest[queue] = float("inf")
            with self._lock:
                for job in jobs:
                    self._running[(queue, job.id)] = job
            self._executing += len(jobs)
            self._claimed += len(jobs)  # here: a later queue's claim may raise (max_jobs)
            for job in jobs:
                self._pool.submit(self._execute, job, self._done)
            free -= len(jobs)
            got += len(jobs)
        return got

    # -- on a pool thread ----------------------------------------------------
    def _execute(self, job: Job, done: _queue.SimpleQueue) -> None:
        """Run one handler; always posts a ``Finished`` to ``done``."""
        finished, started = Finished(job), time.perf_counter()
        self._timeouts.start(job, job.timeout_ms or self.time_limits[job.queue])
        try:
            close_old_connections()
            func = get_handler(job.name)
            if func is None:
                finished.error = unknown_name_error(job.name)
                if job.name not in self._warned:
                    self._warned.add(job.name)
                    log.warning("%s", finished.error)
            else:
                finished.result = func(job)
        except Unrecoverable as exc:  # dead at once, attempts left or not
            finished.error, finished.dead = error_text(exc, below_caller=True), True
        except RateLimited as exc:  # back without spending the attempt (DESIGN §10.3)
            finished.postpone_ms = exc.retry_after_ms
        except BaseException as exc:
            finished.error = error_text(exc, below_caller=True)
        finally:
            try:
                close_old_connections()
            except Exception:
                log.exception("close_old_connections() failed after job %s/%s", job.queue, job.id)
            finished.ms = (time.perf_counter() - started) * 1000
            if self._timeouts.settle(job):
                done.put(finished)
            else:  # its time limit passed first: the attempt was failed already
                self._pool.retire_current()
                log.warning(
                    "job %s/%s (%s): the handler returned %.0f ms after its time limit; "
                    "its result is discarded",
                    *(job.queue, job.id, job.name, finished.ms),
                )

    def _on_timeout(self, job: Job, limit_ms: int) -> None:
        """On the timeouts thread: ``job`` ran past ``limit_ms``. Fail the
        attempt (the reporter retries it by the usual rules) and write its
        thread off; stop claiming when every handler thread is stuck."""
        error = (
            f"TimeoutError: the attempt ran longer than its time limit of {limit_ms} ms "
            "(timeout_ms / TIMEOUT_MS); the handler's late result is discarded"
        )
        self._pool.write_off()
        self._done.put(Finished(job, error=error, ms=float(limit_ms)))
        stuck = self._timeouts.stuck
        log.warning("job %s/%s (%s) timed out after %d ms", job.queue, job.id, job.name, limit_ms)
        if stuck > self.max_stuck:
            log.error(
                "%d handler threads are stuck past their jobs' time limits (max_stuck %d): "
                "the worker stops claiming and returns, for its supervisor to restart it",
                *(stuck, self.max_stuck),
            )
            self.stop()

    def _forget(self, *jobs: Job) -> None:
        with self._lock:
            for job in jobs:
                self._running.pop((job.queue, job.id), None)

    def _log_stats(self, now: float) -> None:
        done = self.processed
        last, since = self._stats_seen
        if done != last:
            rate = (done - last) / max(now - since, 1e-3)
            log.info(
                "processed %d jobs (%.0f/s), failed %d, dead %d, lost %d, queues %s",
                done,
                rate,
                self.stats["failed"],
                self.stats["dead"],
                self.stats["lost"],
                ", ".join(self.queues),
            )
        self._stats_at, self._stats_seen = now + STATS_EVERY_S, (done, now)
