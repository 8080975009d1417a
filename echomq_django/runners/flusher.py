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
any send in flight (``riding``), and sends it in its completions' round
trip, ahead of them (or alone, before its failures): a job's writes always
reach Redis before its completion, so ``get_job().progress`` and the job
log are final when the job is.

Each job's writes are checked against its lease by the script. A refused
one (``LeaseLost``, ``JobNotActive``, ``JobNotFound``) is dropped, counted
in ``stats["dropped"]`` and logged, and the job's ``_writes`` becomes a
``Refused`` that raises that error at the handler's next call. Bounded:
at most ``max_pending`` writes wait unsent; a handler that finds no room
waits for the next send (an outage holds it there).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

from ..core.jobs import Job
from ..protocol.client import EchoMQ
from .outage import REDIS_DOWN, Outage

log = logging.getLogger("echomq_django.worker")

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


class Flusher:
    """Gathers running jobs' writes and sends them (see the module).

    ``mq``: the worker's ``EchoMQ``; ``max_pending``: the bound on writes
    held unsent (count). ``put`` from any thread; ``run`` is the thread;
    ``flush()`` sends what is pending now (the reporter, before each
    batch); ``close()`` ends ``run`` after a last send. ``stats``:
    ``sent`` (writes Redis took), ``dropped`` (writes refused) and
    ``sends`` (round trips of their own, not those riding a batch's
    completions)."""

    def __init__(self, mq: EchoMQ, max_pending: int = MAX_PENDING) -> None:
        self.mq, self.max_pending = mq, max_pending
        self.stats = {"sent": 0, "dropped": 0, "sends": 0}
        self._cv = threading.Condition()  # guards _pending, _closing
        self._send = threading.Lock()  # one send at a time, in the order taken
        self._pending: list[tuple[Job, str | None, str | None]] = []
        self._closing = False

    def put(self, job: Job, progress: str | None, line: str | None, block: bool = True) -> bool:
        """Take one checked write of ``job`` (a progress JSON text, a log
        line, or both). Waits for room past ``max_pending`` writes; with
        ``block`` False returns False instead. Returns True once taken."""
        with self._cv:
            while len(self._pending) >= self.max_pending and not self._closing:
                if not block:
                    return False
                self._cv.wait()
            self._pending.append((job, progress, line))
            if len(self._pending) in (1, SEND_AT):
                self._cv.notify_all()
        return True

    def _ready(self) -> bool:
        return len(self._pending) >= SEND_AT or self._closing

    def pending(self) -> int:
        """Writes taken and not sent yet."""
        with self._cv:
            return len(self._pending)

    def reopen(self) -> None:
        """Start a run: not closing."""
        with self._cv:
            self._closing = False

    def close(self) -> None:
        """End the run: ``run`` sends what is pending once more and returns."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def run(self) -> None:
        """The thread: block until writes are pending, send them all; wait
        out an outage with them kept (the reporter's ``flush`` meets the
        same outage, so no job is completed ahead of its writes)."""
        outage = Outage(self.mq.client, log)
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                self._cv.wait_for(self._ready, timeout=LINGER_S)
                closing = self._closing
            try:
                self.flush()
            except REDIS_DOWN as err:
                if closing:
                    return  # the leases cover the jobs; their last writes are lost
                delay = outage.failed(err)
                with self._cv:
                    self._cv.wait_for(lambda: self._closing, timeout=delay)
                continue
            except Exception:  # a bug must not stop the writes of the next jobs
                log.exception("sending progress and log writes failed")
            else:
                outage.ok()
            if closing:
                return

    def flush(self) -> None:
        """Send every write pending now, after any send in flight, on this
        thread. Raises ``RedisUnavailable`` with the writes kept (sent again
        first)."""
        with self.riding():
            pass

    @contextmanager
    def riding(self):
        """Take every write pending now (after any send in flight; no other
        send starts until the block ends) and yield their script calls, a
        list the caller may send ahead of its own in one round trip
        (``EchoMQ.complete_many(..., ahead=calls)``, which replaces each
        call by its reply). Calls not sent by the end of the block are sent
        alone then. A ``RedisUnavailable`` keeps the writes (sent again
        first) and propagates."""
        with self._send:
            with self._cv:
                batch, self._pending = self._pending, []
                self._cv.notify_all()  # room again
            items = gathered(batch)
            calls, owners = self.mq.progress.calls(items) if items else ([], [])
            ahead = list(calls)
            try:
                yield ahead
                if ahead and ahead[0] is calls[0]:  # not sent by the caller
                    ahead[:] = self.mq.progress.run(calls)
                    self.stats["sends"] += 1
            except REDIS_DOWN:
                with self._cv:
                    self._pending[:0] = batch
                raise
            if not items:
                return
        replies = self.mq.progress.replies(len(items), owners, ahead)
        for (job, progress, lines), reply in zip(items, replies, strict=True):
            n = len(progress) + len(lines)
            if isinstance(reply, Exception):
                self._refused(job, reply, n)
            else:
                self.stats["sent"] += n

    def _refused(self, job: Job, error: Exception, n: int) -> None:
        self.stats["dropped"] += n
        if not isinstance(job._writes, Refused):
            job._writes = Refused(error)
            log.warning(
                "job %s/%s (%s): progress and log writes dropped, the lease was lost: %s",
                job.queue,
                job.id,
                job.name,
                error,
            )


def gathered(batch: list[tuple[Job, str | None, str | None]]) -> list[tuple[Job, list, list]]:
    """``batch``'s writes as one ``(job, progress values, lines)`` per job,
    in the order of each job's first write, each list in the order written."""
    per: dict[int, tuple[Job, list, list]] = {}
    for job, progress, line in batch:
        entry = per.get(id(job))
        if entry is None:
            entry = per[id(job)] = (job, [], [])
        if progress is not None:
            entry[1].append(progress)
        if line is not None:
            entry[2].append(line)
    return list(per.values())
