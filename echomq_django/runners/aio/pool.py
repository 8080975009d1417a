"""The async pool: one event loop, on a thread of its own, running up to
``size`` handler coroutines at once (docs/howto/async-handlers.md#the-async-pool).

The worker claims, reports, extends leases and sends progress and log writes
as on the thread pool; only the handler call moves onto the loop. The
claiming loop posts each job with one ``call_soon_threadsafe``; the job runs
as an ``asyncio.Task``; its ``Finished`` goes to the claiming loop's queue as
a handler thread's does. Jobs past ``size`` wait in a backlog (the
reporter's claims may overshoot by one).

Django's rules, as an ASGI request follows them: each job runs in a
``ThreadSensitiveContext`` of its own, given a **slot** (``Slot``, a
single-thread executor kept across jobs), so the job's thread-sensitive
``sync_to_async`` calls (the async ORM) run on that slot's thread, one at a
time, with that thread's database connections; ``close_old_connections()``
runs there before the job's first call and after the job, only for a job
that used its slot. A sync handler runs on its slot's thread too (as a sync
view under ASGI), with ``close_old_connections()`` around it, as on the
thread pool.

Time limits: the worker's ``Timeouts`` fails the attempt (the same error as
on every pool); ``write_off`` then cancels the job's task
(``asyncio.Task.cancel``), and capacity is kept while it unwinds. A sync
handler cannot be cancelled: its late result is discarded, as on the thread
pool. A coroutine that blocks the loop is named by ``lag.LagWatch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import asgiref
from asgiref.sync import ThreadSensitiveContext
from django.db import close_old_connections

from ...core.jobs import Job
from ...handlers import coroutine_function, get_handler
from ...tracing.spans import attempt, attempt_async
from ..pool import failed, unknown_name
from ..reporter import Finished
from .lag import LagWatch

log = logging.getLogger("echomq_django.worker")

JOIN_S = 1.0  # s: how long a stop that abandons jobs waits for the loop to end


def _close_connections() -> None:
    try:
        close_old_connections()
    except Exception:
        log.exception("close_old_connections() failed on the async pool")


class Slot(ThreadPoolExecutor):
    """One thread for a job's sync calls (see the module); ``used``: the
    current job made one (its connections are closed after the job)."""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.used = False

    def submit(self, fn, /, *args, **kwargs):
        if not self.used:  # the job's first call: Django's rule at a request's start
            self.used = True
            super().submit(_close_connections)
        return super().submit(fn, *args, **kwargs)


class AsyncPool:
    """``size`` handler coroutines at once on one loop (see the module).

    ``name``: the loop thread's name; ``claim_loop``: the worker's
    ``ClaimLoop`` (its ``timeouts``, ``time_limits``, ``mq``, ``warned``).
    ``start(job, done)``, ``write_off(job)``, ``resize(n)``,
    ``shutdown(wait)``; ``size``, ``running`` (jobs on the loop now),
    ``lag`` (its ``LagWatch``).
    """

    kind = "async"

    def __init__(self, size: int, name: str, claim_loop) -> None:
        self.size, self.name, self._cl = size, name, claim_loop
        self._loop = asyncio.new_event_loop()
        # loop thread only: id(job) -> (task, job); jobs waiting for room; free slots
        self._running: dict[int, tuple[asyncio.Task, Job]] = {}
        self._backlog: deque = deque()
        self._slots: list[Slot] = []
        self._made = 0  # slots made, for their threads' names
        self._written: set[int] = set()  # id(job): written off, still unwinding
        self._closing = False
        # jobs posted by the claiming loop, taken by the loop thread (deque: thread-safe)
        self._inbox: deque = deque()
        self._posted = False  # a _take is scheduled and has not started
        self.lag = LagWatch(self._loop, self._job_of, name=name)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # -- called by the claiming loop and the time limits ----------------------
    def start(self, job: Job, done) -> None:
        """Run ``job``'s handler on the loop; its ``Finished`` (or None, for
        an attempt already failed as timed out) goes to ``done``."""
        self._inbox.append((job, done))
        if not self._posted:  # one wake-up of the loop per batch of jobs, not per job
            self._posted = True
            self._loop.call_soon_threadsafe(self._take)

    def write_off(self, job: Job) -> str:
        """``job`` ran past its time limit: its task is cancelled (a sync
        handler's thread runs on, its result discarded); one more job may
        run meanwhile. Returns what the timeout error says became of it."""
        func = get_handler(job.name)
        coro = func is not None and coroutine_function(func) is not None
        self._call(self._write_off, job, coro)
        if coro:
            return "its coroutine was cancelled (asyncio.Task.cancel)"
        return "the handler's late result is discarded"

    def resize(self, size: int) -> None:
        """Run ``size`` (>= 1) coroutines at once: waiting jobs start at
        once; running ones beyond it finish first."""
        self.size = size  # read by the loop thread at its next start of a job
        self._call(self._resize)

    @property
    def running(self) -> int:
        """Jobs on the loop now (written-off ones unwinding included)."""
        return len(self._running)

    def shutdown(self, wait: bool) -> None:
        """Drop the jobs waiting for room (their leases cover them); the loop
        ends once its jobs are done. ``wait``: join it; else the running
        jobs' tasks are cancelled, and the loop waited for ``JOIN_S`` at
        most (a coroutine blocking it cannot be cancelled)."""
        if self._call(self._close, wait):
            self._thread.join(None if wait else JOIN_S)

    def _call(self, fn, *args) -> bool:
        """``fn(*args)`` on the loop thread, soon; False when the loop has
        closed already (a time limit that passed as the run ended)."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    # -- the loop thread -------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self.lag.close()
            for slot in self._slots:
                slot.shutdown(wait=False)
            self._loop.close()

    def _take(self) -> None:
        self._posted = False  # first: a job appended from now on posts again
        inbox = self._inbox
        while inbox:
            job, done = inbox.popleft()
            if self._closing:
                continue  # its lease covers it
            if len(self._running) < self.size + len(self._written):
                self._spawn(job, done)
            else:
                self._backlog.append((job, done))

    def _spawn(self, job: Job, done) -> None:
        key = id(job)
        task = self._loop.create_task(self._run(job, done))
        self._running[key] = (task, job)
        if len(self._running) == 1:
            self.lag.busy(True)
        task.add_done_callback(lambda _, key=key: self._ended(key))

    def _ended(self, key: int) -> None:
        del self._running[key]
        self._written.discard(key)
        while self._backlog and len(self._running) < self.size + len(self._written):
            self._spawn(*self._backlog.popleft())
        if not self._running:
            self.lag.busy(False)
            if self._closing:
                self._loop.stop()

    def _write_off(self, job: Job, coro: bool) -> None:
        entry = self._running.get(id(job))
        if entry is None:
            return  # it ended meanwhile
        self._written.add(id(job))
        if coro:
            entry[0].cancel()
        while self._backlog and len(self._running) < self.size + len(self._written):
            self._spawn(*self._backlog.popleft())

    def _resize(self) -> None:
        for slot in self._slots[self.size :]:  # spare ones: their threads end
            slot.shutdown(wait=False)
        del self._slots[self.size :]
        while self._backlog and len(self._running) < self.size + len(self._written):
            self._spawn(*self._backlog.popleft())

    def _close(self, wait: bool) -> None:
        self._closing = True
        self._backlog.clear()
        if not wait:
            for task, _ in self._running.values():
                task.cancel()
        if not self._running:
            self._loop.stop()

    def _job_of(self, task) -> Job | None:
        for running, job in self._running.values():
            if running is task:
                return job
        return None

    def _slot(self) -> Slot:
        if self._slots:
            return self._slots.pop()
        self._made += 1
        return Slot(f"{self.name}_sync_{self._made}")

    def _free(self, slot: Slot) -> None:
        if len(self._slots) < self.size and not self._closing:
            self._slots.append(slot)
        else:
            slot.shutdown(wait=False)

    async def _run(self, job: Job, done) -> None:
        """Run one handler; always posts a ``Finished`` (or None) to ``done``."""
        cl = self._cl
        finished, started = Finished(job), time.perf_counter()
        limit_ms = job.timeout_ms or cl.time_limits[job.queue]
        cl.timeouts.start(job, limit_ms)
        slot = self._slot()
        try:
            func = get_handler(job.name)
            coro = None if func is None else coroutine_function(func)
            if func is None:
                finished.error = unknown_name(job, cl.warned)
            elif coro is None:  # a sync handler: on its slot's thread, as on the thread pool
                await asyncio.wrap_future(
                    ThreadPoolExecutor.submit(slot, self._call_sync, func, job, finished)
                )
            else:
                async with ThreadSensitiveContext(executor=slot):
                    finished.result = await attempt_async(coro, job)  # in a span when traced
        except BaseException as exc:  # a cancel past the time limit too: discarded below
            failed(finished, exc, cl.mq)
        finally:
            if slot.used:  # Django's rule at a request's end, on the thread that used them
                closed = asyncio.wrap_future(ThreadPoolExecutor.submit(slot, _close_connections))
                slot.used = False
                with contextlib.suppress(asyncio.CancelledError):  # a stop cancelling it
                    await asyncio.shield(closed)
            self._free(slot)
            finished.ms = (time.perf_counter() - started) * 1000
            if cl.timeouts.settle(job):
                done.put(finished)
            else:  # its time limit passed first: the attempt was failed already
                done.put(None)  # a stopping loop waits for written-off handlers too
                log.warning(
                    "job %s/%s (%s): the handler ended %.0f ms after its time limit of %d ms "
                    "(it ran %.0f ms); its result is discarded",
                    *(job.queue, job.id, job.name, finished.ms - limit_ms, limit_ms, finished.ms),
                )

    def _call_sync(self, func, job: Job, finished: Finished) -> None:
        """On a slot's thread: a sync handler, as ``pool.run_handler``."""
        try:
            _close_connections()
            finished.result = attempt(func, job)  # in a span when traced
        except BaseException as exc:
            failed(finished, exc, self._cl.mq)
        finally:
            _close_connections()


def check() -> None:
    """Raise ``ValueError`` unless asgiref can run a job's sync calls on its
    slot (``ThreadSensitiveContext(executor=...)``, asgiref 3.13)."""
    if "executor" not in inspect.signature(ThreadSensitiveContext).parameters:
        raise ValueError(
            f"the async pool needs asgiref >= 3.13 (installed: {asgiref.__version__}): "
            "pip install -U asgiref"
        )


def make(claim_loop, name: str) -> AsyncPool:
    """The ``make_pool(loop, name)`` a ``ClaimLoop`` calls at each run's
    start: an async pool of ``claim_loop.concurrency`` coroutines."""
    return AsyncPool(claim_loop.concurrency, name, claim_loop)
