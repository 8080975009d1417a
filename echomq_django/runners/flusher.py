"""The worker's flusher: its handlers' progress and job log writes, gathered
and sent pipelined (docs/explanation/protocol.md#progress-and-log-lines).

A handler's ``job.report_progress`` / ``job.log`` checks its value on the
host and hands it here (``Flusher.put``), returning without a round trip.
The flusher thread blocks on a condition until writes are pending, gathers
more for up to ``LINGER_S`` (or until ``SEND_AT`` wait), then takes
everything every handler thread put meanwhile and sends it in one round
trip (``mq.progress.calls`` and ``run``: one ``write_reports`` script per queue,
each job's progress values and lines in the order written). When the
reporter completes or fails a batch it takes what is still pending, after
any send in flight (``riding``): the writes of the jobs it completes ride
their own ``complete`` calls, which write them before any completion (one
script instead of two: ``Ride``); the rest go in the completions' round
trip, ahead of them (or alone, before its failures): a job's writes always
reach Redis before its completion, so ``get_job().progress`` and the job
log are final when the job is.

Each job's writes are checked against its lease by the script. A refused
one (``LeaseLost``, ``JobNotActive``, ``JobNotFound``) is dropped, with the
job's writes taken while it was sent, counted in ``stats["dropped"]`` (and
the metrics' ``writes_dropped``, reason ``lease``) and logged, and the
job's ``_writes`` becomes a ``Refused`` that raises that error at the
handler's next call. Bounded: at most
``max_pending`` writes wait unsent; a handler that finds no room waits for
the next send (an outage holds it there; counted in ``stats["waited"]`` and
``writes_waited``): the bound holds writers, it drops nothing. Writes still
unsent when a run ends with Redis away are lost (reason ``stopped``).
Metrics: docs/reference/metrics.md#progress-and-log-writes.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any

from ..core.exceptions import JobCancelled, JobNotActive, JobNotFound, LeaseLost
from ..core.jobs import Job
from ..protocol.client import EchoMQ
from ..protocol.live.progress import PER_ENTRY
from .outage import REDIS_DOWN, Outage

log = logging.getLogger("echomq_django.worker")

GONE = (LeaseLost, JobNotActive, JobNotFound)  # a refused job's writes are refused with it
MAX_PENDING = 10_000  # writes a worker holds unsent at most (a handler waits beyond)
# Once a write waits, the thread gathers more for up to LINGER_S (s), or until SEND_AT
# writes wait: one round trip then carries many jobs' writes instead of one or two, and
# the writes of a job that ends meanwhile ride its completion's round trip instead
LINGER_S = 0.02
SEND_AT = 500


class Refused:
    """The ``_writes`` of a job a write of which the script refused: every
    later call raises ``error`` (a fresh copy; nothing is taken)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def put(self, job: Job, progress: str | None, line: str | None, block: bool = True) -> bool:
        """Raise the refusal again (``LeaseLost``, ``JobNotActive``,
        ``JobNotFound``); the write is not taken."""
        raise type(self.error)(*self.error.args)


class Ride:
    """What a batch's completions take along (``Flusher.riding``): ``carry``
    (``id(job)`` -> ``(job, progress values, lines)``: the pending writes of
    the jobs it completes, which their ``complete`` calls pop), ``ahead``
    (the ``write_reports`` calls of the rest, ``rest``, to send ahead of
    them), ``taken`` (what ``carry`` held at first) and ``count`` (the
    writes it holds); ``settle(jobs,
    replies)`` hands over the completions' replies, which say how the
    carried writes went (docs/explanation/protocol.md#progress-and-log-lines)."""

    __slots__ = ("ahead", "carry", "count", "jobs", "replies", "rest", "taken")

    def __init__(self, batch: dict[int, tuple[Job, list, list]], completing) -> None:
        """``batch``: the writes taken (``id(job)`` -> ``(job, progress
        values, lines)``, in the order of each job's first write; left as
        it is); ``completing``: the ``Job`` objects the batch completes."""
        self.ahead: list = []
        self.jobs, self.replies = (), ()
        self.carry: dict[int, tuple[Job, list, list]] = {}
        carry, count = self.carry, 0
        if batch and completing:
            get = batch.get
            for key in map(id, completing):
                item = get(key)
                if item is not None and len(item[1]) <= PER_ENTRY >= len(item[2]):
                    carry[key] = item
                    count += len(item[1]) + len(item[2])
        if not carry:
            self.rest = list(batch.values())
        elif len(carry) < len(batch):
            self.rest = [item for key, item in batch.items() if key not in carry]
        else:
            self.rest = []
        self.taken, self.count = dict(carry), count

    def settle(self, jobs: list[Job], replies: list) -> None:
        """The completions of ``jobs`` answered ``replies`` (as
        ``complete_many`` returns them, in the same order)."""
        self.jobs, self.replies = jobs, replies


class Flusher:
    """Gathers running jobs' writes and sends them (see the module).

    ``mq``: the worker's ``EchoMQ``; ``max_pending``: the bound on writes
    held unsent (count); ``metrics``: None or an object with
    ``writes_dropped(queue, reason, n)`` (reason ``lease`` or ``stopped``)
    and ``writes_waited(queue, n)`` (the worker's
    ``monitoring.metrics.ProcessMetrics``). ``put`` from any thread;
    ``run`` is the thread; ``flush()`` sends what is pending now (the
    reporter, before each batch); ``close()`` ends ``run`` after a last
    send. ``stats``: ``sent`` (writes Redis took), ``dropped`` (writes
    refused, or lost when a run ended with Redis away), ``waited`` (writes
    whose handler waited for room) and ``sends`` (round trips of their own,
    not those riding a batch's completions)."""

    def __init__(self, mq: EchoMQ, max_pending: int = MAX_PENDING, metrics: Any = None) -> None:
        self.mq, self.max_pending, self.metrics = mq, max_pending, metrics
        self.stats = {"sent": 0, "dropped": 0, "sends": 0, "waited": 0}
        self._lock = threading.Lock()  # guards _pending, _count, _since, _idle, _closing
        self._work = threading.Condition(self._lock)  # the thread waits here for writes
        self._room = threading.Condition(self._lock)  # a handler waits here for room
        self._send = threading.Lock()  # one send at a time, in the order taken
        # id(job) -> (job, progress values, lines), gathered as they come (the
        # entry holds the job, so its id stays its own); _count: the writes held
        self._pending: dict[int, tuple[Job, list, list]] = {}
        self._count = 0
        self._since = 0.0  # monotonic s when the oldest pending write was taken
        self._idle = False  # the thread waits for a first write (not lingering)
        self._closing = False

    def put(self, job: Job, progress: str | None, line: str | None, block: bool = True) -> bool:
        """Take one checked write of ``job`` (a progress JSON text, a log
        line, or both). Waits for room past ``max_pending`` writes (counted
        in ``stats["waited"]`` and the metrics' ``writes_waited``); with
        ``block`` False returns False instead. Returns True once taken."""
        with self._lock:  # the conditions' lock, held without their Python wrappers
            if self._count >= self.max_pending and not self._closing:
                if not block:
                    return False
                self._wait_for_room(job)
            if isinstance(job._writes, Refused):  # refused since the caller looked, or as it waited
                job._writes.put(job, progress, line)
            entry = self._pending.get(id(job))
            if entry is None:
                entry = self._pending[id(job)] = (job, [], [])
            if progress is not None:
                entry[1].append(progress)
            if line is not None:
                entry[2].append(line)
            before = self._count
            n = self._count = before + (progress is not None) + (line is not None)
            if not before:
                self._since = time.monotonic()
                if self._idle:  # a lingering thread reads _since when its wait ends
                    self._work.notify()
            elif before < SEND_AT <= n:
                self._work.notify()
        return True

    def _wait_for_room(self, job: Job) -> None:
        """Hold the caller (the lock held) until the pending writes fall
        below the bound or the run closes; counted once per write held."""
        self.stats["waited"] += 1
        if self.metrics is not None:
            self.metrics.writes_waited(job.queue, 1)
        while self._count >= self.max_pending and not self._closing:
            self._room.wait()

    def pending(self) -> int:
        """Writes taken and not sent yet."""
        with self._work:
            return self._count

    def reopen(self) -> None:
        """Start a run: not closing."""
        with self._work:
            self._closing = False

    def close(self) -> None:
        """End the run: ``run`` sends what is pending once more and returns."""
        with self._work:
            self._closing = True
            self._work.notify_all()
            self._room.notify_all()

    def run(self) -> None:
        """The thread: block until writes are pending, send them all; wait
        out an outage with them kept (the reporter's ``flush`` meets the
        same outage, so no job is completed ahead of its writes)."""
        outage = Outage(self.mq.client, log)
        while True:
            with self._work:
                self._linger()
                closing = self._closing
            try:
                self.flush()
            except REDIS_DOWN as err:
                if closing:
                    self._lost()  # the leases cover the jobs; their last writes are lost
                    return
                delay = outage.failed(err)
                with self._work:
                    self._work.wait_for(lambda: self._closing, timeout=delay)
                continue
            except Exception:  # a bug must not stop the writes of the next jobs
                log.exception("sending progress and log writes failed")
            else:
                outage.ok()
            if closing:
                return

    def _linger(self) -> None:
        """Return (the lock held) once a send is due: the run closes,
        ``SEND_AT`` writes wait, or the oldest has waited ``LINGER_S``. Woken
        only by a first write while idle, by ``SEND_AT`` and by ``close``: the
        reporter taking the writes meanwhile wakes nothing, and a wait that
        ends on newer writes waits out their own linger (one wake per
        ``LINGER_S`` at most while writes keep coming)."""
        while not self._closing and self._count < SEND_AT:
            if not self._count:
                self._idle = True
                self._work.wait()
                self._idle = False
                continue
            left = self._since + LINGER_S - time.monotonic()
            if left <= 0:
                return
            self._work.wait(left)

    def flush(self) -> None:
        """Send every write pending now, after any send in flight, on this
        thread. Raises ``RedisUnavailable`` with the writes kept (sent again
        first)."""
        with self.riding():
            pass

    @contextmanager
    def riding(self, completing=()):
        """Take every write pending now (after any send in flight; no other
        send starts until the block ends) and yield a ``Ride``: the writes
        of the jobs in ``completing`` (the ``Job`` objects the caller
        completes in the block) in ``ride.carry``, for their ``complete``
        calls (``EchoMQ.complete_many(..., ahead, carry)`` pops each it
        carries); the others' script calls in ``ride.ahead``, a list the
        caller may send ahead of its own in one round trip (replaced in
        place by their replies). Calls not sent and writes not carried by
        the end of the block are sent alone then; the caller hands its
        completions' replies to ``ride.settle``. A ``RedisUnavailable`` keeps
        the writes (sent again first) and propagates."""
        with self._send:
            with self._work:
                batch, self._pending, self._count = self._pending, {}, 0
                self._room.notify_all()  # room again
            ride = Ride(batch, completing)
            calls, owners = self.mq.progress.calls(ride.rest) if ride.rest else ([], [])
            ride.ahead = ahead = list(calls)
            try:
                yield ride
                if ahead and ahead[0] is calls[0]:  # not sent by the caller
                    ahead[:] = self.mq.progress.run(calls)
                    self.stats["sends"] += 1
                if ride.carry:  # not carried (a result that did not encode): alone
                    left = [ride.taken.pop(key) for key in ride.carry]
                    ride.carry.clear()
                    ride.count -= sum(len(item[1]) + len(item[2]) for item in left)
                    self._settle(left, self.mq.progress.write_many(left))
                    self.stats["sends"] += 1
            except REDIS_DOWN:
                with self._work:
                    self._put_back(list(batch.values()))
                raise
            if not batch:
                return
            # settled before the next send: a refusal drops the job's writes taken meanwhile
            self._settle(ride.rest, self.mq.progress.replies(len(ride.rest), owners, ahead))
            self._carried(ride)

    def _settle(self, items: list, replies: list) -> None:
        for (job, progress, lines), reply in zip(items, replies, strict=True):
            n = len(progress) + len(lines)
            if isinstance(reply, Exception):
                self._refused(job, reply, n)
            else:
                self.stats["sent"] += n

    def _carried(self, ride: Ride) -> None:
        """Count the carried writes by their jobs' completion replies:
        refused with a refused job (``LeaseLost``, ``JobNotActive``,
        ``JobNotFound``), written for any other job (a cancelled one too, as
        ``lua/complete.lua`` writes them first); those of a call that failed
        whole (a script error: the reporter keeps its jobs) are pending
        again, first, to ride the completion sent again, which refuses them
        once the failed call got as far as completing the job."""
        if not ride.taken:
            return
        if not any(isinstance(reply, Exception) for reply in ride.replies):
            self.stats["sent"] += ride.count  # the usual batch: every job completed
            return
        outcome = dict(zip(map(id, ride.jobs), ride.replies, strict=True))
        again, sent = [], 0
        for key, item in ride.taken.items():
            reply = outcome.get(key)
            if not isinstance(reply, Exception) or isinstance(reply, JobCancelled):
                sent += len(item[1]) + len(item[2])
            elif isinstance(reply, GONE):
                self._refused(item[0], reply, len(item[1]) + len(item[2]))
            else:
                again.append(item)
        self.stats["sent"] += sent
        if again:
            with self._work:
                self._put_back(again)

    def _put_back(self, items: list[tuple[Job, list, list]]) -> None:
        """Hold ``items`` (``(job, progress values, lines)``) pending again
        (the lock held), ahead of what was put meanwhile: each job's writes
        stay in the order written."""
        if not items:
            return
        if not self._count:
            self._since = time.monotonic()
        self._count += sum(len(progress) + len(lines) for _, progress, lines in items)
        merged: dict[int, tuple[Job, list, list]] = {}
        for job, progress, lines in (*items, *self._pending.values()):
            entry = merged.get(id(job))
            if entry is None:
                merged[id(job)] = (job, list(progress), list(lines))
            else:
                entry[1].extend(progress)
                entry[2].extend(lines)
        self._pending = merged

    def _lost(self) -> None:
        """The run ends with Redis away: the writes still pending are lost,
        counted as dropped (``stopped``)."""
        with self._work:
            batch, self._pending, self._count = self._pending, {}, 0
        per: dict[str, int] = {}
        for job, progress, lines in batch.values():
            per[job.queue] = per.get(job.queue, 0) + len(progress) + len(lines)
        for queue, n in per.items():
            self._dropped(queue, "stopped", n)
        if batch:
            log.warning(
                "%d progress and log writes lost: the worker stopped with Redis away",
                sum(per.values()),
            )

    def _dropped(self, queue: str, reason: str, n: int) -> None:
        self.stats["dropped"] += n
        if self.metrics is not None:
            self.metrics.writes_dropped(queue, reason, n)

    def _refused(self, job: Job, error: Exception, n: int) -> None:
        """``n`` writes of ``job`` were refused with ``error``: they are
        dropped, with the job's writes taken since when ``error`` is one of
        ``GONE`` (the same lost lease), and its ``_writes`` raises from now on."""
        with self._work:
            first = not isinstance(job._writes, Refused)
            if first:
                job._writes = Refused(error)
            left = self._pending.pop(id(job), None) if isinstance(error, GONE) else None
            if left is not None:
                taken = len(left[1]) + len(left[2])
                n, self._count = n + taken, self._count - taken
                self._room.notify_all()
        self._dropped(job.queue, "lease", n)
        if first:
            log.warning(
                "job %s/%s (%s): progress and log writes dropped, the lease was lost: %s",
                job.queue,
                job.id,
                job.name,
                error,
            )
