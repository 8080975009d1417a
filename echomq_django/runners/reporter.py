"""The worker's reporter: finished jobs go back to Redis in batches
(docs/explanation/protocol.md#complete; worker.py's docstring: the threads).

The claiming loop hands each batch of ``Finished`` jobs over
(``Reporter.hand_over``); the reporter thread completes every successful
one with one pipelined ``complete_many`` and fails the rest with one
``fail_many``, then counts and logs that batch, and sends ``job_failed``
for the attempts that will be retried (the one signal that stays
in-process; the others are durable events the dispatcher sends,
docs/explanation/signals.md). A batch leaves the reporter only once Redis
has answered for it: an outage is waited out (``outage.Outage``) with the
batch kept, so no job is acknowledged without Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from .. import signals
from ..core.exceptions import (
    JobCancelled,
    JobNotActive,
    JobNotFound,
    LeaseLost,
    PayloadError,
    RedisUnavailable,
)
from ..core.jobs import Job, JobState, Outcome
from ..core.refs import JobRef
from ..protocol.client import EchoMQ
from .delivery import OwnDelivery
from .direct import ride_room, sibling_or_else
from .outage import REDIS_DOWN, Outage, first_line

log = logging.getLogger("echomq_django.worker")

GONE = (LeaseLost, JobNotActive, JobNotFound)
_no_ride = lambda jobs=(): nullcontext()  # noqa: E731  (a worker without a flusher)
STATS_EVERY_S = 5.0  # s between the worker's INFO lines while busy


@dataclass(slots=True)
class Finished:
    """A job its handler is done with, on its way to Redis. ``error`` is None
    when the handler returned ``result``; otherwise it is the text to store,
    and ``dead`` says the job fails for good (the handler raised
    ``Unrecoverable``). ``ms``: how long the handler ran (ms).
    ``postpone_ms``: the handler raised ``RateLimited``: the job goes back
    for that long without spending its attempt (docs/explanation/protocol.md#scheduling);
    ``MoveToDelayed`` too. ``wait_children``: the handler raised
    ``WaitForChildren``: the job is held for the children it added
    (docs/explanation/protocol.md#step-jobs)."""

    job: Job
    result: Any = None
    error: str | None = None
    dead: bool = False
    ms: float = 0.0
    postpone_ms: int | None = None
    delay_ms: int | None = None  # before the next attempt (ms): its retry policy's
    wait_children: bool = False


class Reporter:
    """Reports the jobs a ``Worker`` hands over, on a thread of its own.

    ``mq``: the worker's ``EchoMQ``; ``sender``: the signals' sender (the
    worker); ``forget(*jobs)``: the worker stops tracking jobs reported (or
    dropped); ``released(queue)``: a parent on ``queue`` was released;
    ``wake()``: wakes the claiming loop after each batch; ``metrics``: an
    object with ``job_finished(queue, name, outcome, seconds)`` (the
    worker's ``metrics.ProcessMetrics``) or None; ``fetch(queue)``: room
    for a job of ``queue`` claimed in the round trip that completes a child
    whose parent is on ``queue`` (``(count, lease ms, token)``, or None for
    none), and ``taken(queue, token, claimed)``: what that claim gave (a
    ``Claimed``, or the exception it raised), both from the loop (None: no
    such claims). ``processed`` and ``stats`` (``completed``, ``failed`` =
    will retry, ``dead``, ``lost``) count every run; ``unreported``: jobs
    handed over and not reported yet in this run; ``down``: its last batch met an outage (the
    loop claims nothing new until one goes through). ``writes``: the worker's
    ``flusher.Flusher`` or None; each batch takes its pending progress and
    log writes: its completed jobs' ride their ``complete`` calls, the rest
    go ahead of them in their round trip (alone when it completes none), so
    a job's writes reach Redis before its completion or failure."""

    def __init__(
        self,
        mq: EchoMQ,
        sender: Any,
        forget: Callable[..., None],
        released: Callable[[str], None],
        wake: Callable[[], None],
        metrics: Any = None,
        writes: Any = None,
        fetch: Callable[..., tuple[int, int, str] | None] | None = None,
        taken: Callable[[str, str, Any], None] | None = None,
        holds: Callable[[Any], bool] | None = None,
    ) -> None:
        self.mq, self.sender, self.metrics = mq, sender, metrics
        self._writes = writes
        self._forget, self._released, self._wake = forget, released, wake
        self._fetch, self._taken = fetch, taken
        self._own = OwnDelivery(mq, released, fetch, taken, holds)
        self.processed = 0
        self.stats = {"completed": 0, "failed": 0, "dead": 0, "lost": 0, "postponed": 0}
        self.debug = False  # a line per job (set per run from the log level)
        self._cv = threading.Condition()  # guards _inbox, unreported, _closing
        self._turn = threading.Lock()  # held while reporting: by this thread or report_own
        self._inbox: list[Finished] = []
        # (queue, room): slots the loop held for a riding claim; those of the batch at hand
        self._held: list[tuple[str, tuple]] = []
        self._rides: list[tuple[str, tuple]] = []
        self.unreported, self.down, self._closing = 0, False, False
        self.stats_at, self.stats_seen = 0.0, (0, 0.0)  # the next INFO line; (processed, when)

    def start_stats(self, now: float) -> None:
        """Start counting for the INFO lines at ``now`` (monotonic s)."""
        self.stats_at, self.stats_seen = now + STATS_EVERY_S, (self.processed, now)

    def log_stats(self, now: float, queues) -> None:
        """The worker's INFO line (jobs and rate since the last one) when it
        processed any since; the next is due ``STATS_EVERY_S`` after ``now``."""
        done, (last, since) = self.processed, self.stats_seen
        if done != last:
            rate = (done - last) / max(now - since, 1e-3)
            log.info("processed %d jobs (%s/s), failed %d, dead %d, lost %d, queues %s", done,
                     f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}",
                     *(self.stats[k] for k in ("failed", "dead", "lost")),
                     ", ".join(queues))  # fmt: skip
        self.start_stats(now)

    def reset(self) -> None:
        """Start a run: nothing handed over, not closing."""
        self._inbox, self._held, self.unreported, self._closing = [], [], 0, False
        self.down = False
        self.debug = log.isEnabledFor(logging.DEBUG)

    def hand_over(self, finished: list[Finished], held: tuple | None = None) -> None:
        """Give the reporter thread ``finished`` jobs to report; ``held``: ``(queue,
        room)``, a slot the loop held for a claim riding their completion (``fetch``;
        given back by ``taken`` with no jobs when none rode on it)."""
        with self._cv:
            if held is not None:
                self._held.append(held)
            self._inbox.extend(finished)
            self.unreported += len(finished)
            self._cv.notify()

    def close(self) -> None:
        """End the run: the thread returns; what it holds is left to leases."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def run(self) -> None:
        """The thread: report what is handed over, batch by batch, while the
        loop claims: Redis runs one side's scripts while Python does the
        other's work. Waits out an outage keeping the batch; wakes the loop
        after each batch (a released parent may be claimable now)."""
        items: list[Finished] = []
        # its tries at most BACKOFF_MAX_S (2 s) apart: the loop claims nothing while it waits
        outage = Outage(self.mq.client, log)
        while True:
            with self._cv:
                while not self._inbox and not items and not self._closing:
                    if (due := self._own.due) is not None and due <= time.monotonic():
                        break  # a delivery held back for a sibling (delivery.OwnDelivery)
                    self._cv.wait(None if due is None else due - time.monotonic())
                closing, idle = self._closing, not self._inbox and not items
            if closing or idle:  # what is held back goes now: its time is up, or a stop
                with self._turn:
                    self._own.flush(claim=not closing)  # a stopping loop takes no job
                if closing:  # the loop is done, or gave up: leases cover the rest
                    return
                continue
            with self._turn:  # a handler's own report (report_own) ends first
                before = self._batch(items, outage)
            with self._cv:
                self.unreported -= before - len(items)
            self._wake()

    def _batch(self, items: list[Finished], outage: Outage) -> int:
        """One batch of ``run``: what was handed over joins ``items`` (those
        kept from the last), reported; returns how many there were."""
        with self._cv:
            items.extend(self._inbox)
            self._inbox.clear()
            self._rides, self._held = self._held, []
        before = len(items)
        try:
            close_old_connections()  # signal receivers may use the database
            self.report(items)
            close_old_connections()
        except REDIS_DOWN as err:
            self.down = True  # the loop claims nothing new until a batch goes through
            delay = outage.failed(err)
            with self._cv:
                self._cv.wait_for(lambda: self._closing, timeout=delay)
        except Exception:  # a bug must not stall the loop's accounting
            self.down = False
            log.exception("reporting %d jobs failed; their leases will expire and the pump "
                          "recovers them", len(items))  # fmt: skip
            self._forget(*(f.job for f in items))
            items.clear()
        else:
            outage.ok()
            self.down = False
        for queue, (_, _, token) in self._rides:  # held, and not ridden on: freed
            self._taken(queue, token, [])
        self._rides = []
        return before

    def report_own(self, finished: Finished) -> bool:
        """(A handler thread: direct.py) Report ``finished`` now, a batch of its
        own, when the reporter thread has nothing handed over, kept or in hand;
        True when Redis took it, False when it is left to ``hand_over``."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            if self.unreported or self._inbox or self._closing:
                return False
            items = [finished]
            with suppress(Exception):  # an outage, a refusal: the reporter thread's
                self.report(items)
            if self._own.due is not None:  # held back: the thread's wait is now timed
                with self._cv:
                    self._cv.notify()
            return not items
        finally:
            self._turn.release()

    def report(self, finished: list[Finished]) -> None:
        """Complete and fail every finished job: one round trip each. Items
        leave ``finished`` only once Redis has answered for them, so a
        ``RedisUnavailable`` (propagated) loses nothing."""
        if not finished:
            return
        kept: list[Finished] = []  # not refused, not taken: sent again after a pause
        riding = self._writes.riding if self._writes is not None else _no_ride
        if any(f.postpone_ms is not None or f.wait_children for f in finished):
            with riding():  # their progress and log writes land first, alone
                pass
        self._postpone(finished)
        good = [f for f in finished if f.error is None]
        with riding([f.job for f in good]) as ride:  # their writes, in the same round trip
            replies = self._complete(good, ride) if good else []
        if good:
            finished[:] = [f for f in finished if f.error is not None]
            done = []
            for item, reply in zip(good, replies, strict=True):
                if isinstance(reply, PayloadError):
                    # dead at once: another attempt would run the handler's side
                    # effects again only to return the same unencodable result
                    finished.append(
                        Finished(item.job, None, f"PayloadError: {reply}", True, item.ms)
                    )
                elif isinstance(reply, GONE):
                    self._drop(item.job, reply)
                elif isinstance(reply, Exception):
                    kept.append((item, reply))
                else:
                    done.append((item, reply))
            self._completed(done)
        if finished:
            # a death's entries for a parent on another queue: delivered here, as
            # a completion's are (its queue's sweep lock rides ahead of the fails)
            calls = self._own.ahead(finished, None, direct=False)
            try:
                failing = [(f.job, f.error, f.dead, f.delay_ms) for f in finished]
                replies = self.mq.fail_many(failing, calls)
            except REDIS_DOWN:
                finished.extend(f for f, _ in kept)
                raise
            except Exception as err:
                replies = [err] * len(finished)
            self._own.after(finished, replies, None)  # (a lock taken is dropped)
            items, finished[:] = list(finished), []
            failed = []
            for f, r in zip(items, replies, strict=True):
                if isinstance(r, GONE):
                    self._drop(f.job, r)
                elif isinstance(r, Exception):
                    kept.append((f, r))
                else:
                    failed.append((f, r))
            self._failed(failed)
        if kept:
            # Only a script's refusal (EMQSTATE, EMQLEASE, EMQNOJOB) drops a
            # result; anything else (OOM, BUSY, an error in a script) keeps it
            # for the next try, like an outage
            # (docs/explanation/reliability.md#not-now-is-not-no). A job that
            # can never be reported is refused once its lease has expired.
            finished.extend(f for f, _ in kept)
            raise RedisUnavailable(
                f"Redis did not take {len(kept)} result(s) ({kept[0][1]!r}); "
                "they are kept and sent again"
            )

    def _complete(self, good: list[Finished], ride: Any) -> list:
        """``complete_many`` of ``good`` (``ride``: None, or the flusher's
        ``Ride``: their pending writes, carried by their ``complete`` calls,
        and the other jobs' writes, sent ahead in the round trip), with a
        claim in the same round trip when ``ride_room`` finds room for one: of
        a parent's queue (the parent a completion releases starts without a
        claim of its own), or on a Cluster of a cross-queue child's own queue
        (its next sibling). A child whose parent is on another slot: its
        queue's sweep lock is taken ahead of it, so what its completion pushes
        onto the outbox is this worker's to deliver
        (docs/explanation/no-polling.md#a-released-parent-starts-at-once)."""
        pairs = [(f.job, f.result) for f in good]
        across = self.mq.cross_queue_scripts
        queue, room = ride_room(self._fetch, self._rides, good, across)
        ahead, carry = (ride.ahead, ride.carry) if ride is not None else (None, None)
        calls = self._own.ahead(good, ahead)  # a cross-queue child's sweep lock
        if room is None:
            replies = self.mq.complete_many(pairs, calls, carry)
        else:
            count, lease_ms, token = room
            sent = [(queue, token)]
            if (alt := sibling_or_else(self._fetch, good, queue, token, across)) is not None:
                sent.insert(0, (alt[0], alt[3]))  # given back first: its slot is the other's
            or_else = None if alt is None else (alt[0], alt[2], alt[3])  # queue, lease, token
            try:
                replies, claimed = self.mq.complete_then_claim(
                    pairs, queue, count, lease_ms, token, calls, carry, or_else
                )
            except BaseException as err:
                for q, t in sent:  # RedisUnavailable: the loop replays the tokens
                    self._taken(q, t, err)
                raise
            claimed = (claimed,) if alt is None else claimed[::-1]
            for (q, t), got in zip(sent, claimed, strict=True):
                self._taken(q, t, got)
        self._own.after(good, replies, ahead)  # and its delivery
        if ride is not None:
            ride.settle([job for job, _ in pairs], replies)
        return replies

    def _postpone(self, finished: list[Finished]) -> None:
        """Put back, one script each, the jobs whose handler raised
        ``RateLimited`` or ``MoveToDelayed``, and hold those that raised
        ``WaitForChildren``; each leaves ``finished`` once Redis answered."""
        for f in [f for f in finished if f.postpone_ms is not None or f.wait_children]:
            try:
                if f.wait_children:
                    self.mq.flows.wait_for_children(f.job)
                else:
                    self.mq.timers.postpone(f.job, f.postpone_ms)
            except REDIS_DOWN:
                raise
            except Exception as err:
                self._drop(f.job, err)
            else:
                self._forget(f.job)
                self.stats["postponed"] += not f.wait_children
                if self.debug and f.wait_children:
                    log.debug("job %s/%s waits for its children", f.job.queue, f.job.id)
                elif self.debug:
                    log.debug("job %s/%s postponed: back in %d ms", f.job.queue, f.job.id,
                              f.postpone_ms)  # fmt: skip
            finished.remove(f)

    def _drop(self, job: Job, reply: Exception) -> None:
        """Forget a job whose result a script refused (``GONE``: the lease was
        lost, the job moved on or was cancelled)."""
        self._forget(job)
        self.stats["lost"] += 1
        if isinstance(reply, JobCancelled):  # docs/explanation/lifecycle.md: it died 'cancelled'
            log.info("job %s/%s (%s): cancelled while it ran; its result is dropped",
                     job.queue, job.id, job.name)  # fmt: skip
        else:
            log.warning("job %s/%s (%s): result dropped, the lease was lost: %s",
                        job.queue, job.id, job.name, reply)  # fmt: skip

    def _completed(self, done: list[tuple[Finished, Outcome]]) -> None:
        self._forget(*(f.job for f, _ in done))
        for f, outcome in done:
            job = f.job
            if self.debug:
                log.debug("job %s/%s (%s) completed in %.1f ms", job.queue, job.id, job.name, f.ms)
            if self.metrics is not None:
                self.metrics.job_finished(job.queue, job.name, "completed", f.ms / 1000)
            self._after(job, outcome)
        self.stats["completed"] += len(done)
        self.processed += len(done)

    def _failed(self, failed: list[tuple[Finished, Outcome]]) -> None:
        listening = signals.job_failed.has_listeners(self.sender)
        self._forget(*(f.job for f, _ in failed))
        for f, outcome in failed:
            job, error = f.job, f.error
            dead = outcome.state is JobState.DEAD
            self.stats["dead" if dead else "failed"] += 1
            if self.metrics is not None:
                outcome_name = "dead" if dead else "failed"
                self.metrics.job_finished(job.queue, job.name, outcome_name, f.ms / 1000)
            if dead:
                log.warning("job %s/%s (%s) is dead after %d attempts: %s", job.queue, job.id,
                            job.name, job.attempts, first_line(error))  # fmt: skip
            elif self.debug:
                log.debug("job %s/%s (%s) failed in %.1f ms (attempt %d of %d, %s): %s",
                          job.queue, job.id, job.name, f.ms, job.attempts, job.max_attempts,
                          outcome.state, first_line(error))  # fmt: skip
            if listening and not dead:  # job_dead is a durable event
                signals.send(signals.job_failed, self.sender, queue=job.queue, job_id=job.id,
                             ref=JobRef._trusted(job.queue, job.id), job_name=job.name,
                             error=error, run_at=outcome.run_at)  # fmt: skip
            self._after(job, outcome)
        self.processed += len(failed)

    def _after(self, job: Job, outcome: Outcome) -> None:
        """Wake queues where a parent was released."""
        for queue, _ in outcome.released:
            self._released(queue)
