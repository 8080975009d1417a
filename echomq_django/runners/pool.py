"""Running handlers: the pools a worker can run them on (``POOLS``), its
handler threads, and what the outcome of a failed handler is and its error
reads like (docs/explanation/protocol.md#fail; the decisions are listed in
worker.py's docstring).
"""

from __future__ import annotations

import difflib
import logging
import queue as _queue
import sys
import threading
import time
import traceback

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from ..core.exceptions import MoveToDelayed, RateLimited, Unrecoverable, WaitForChildren
from ..core.retry import decide
from ..handlers import TASK_JOB_NAME, get_handler, registered, tasks_framework
from ..tracing.spans import attempt, attempt_async, refused_attempt
from .reporter import Finished

log = logging.getLogger("echomq_django.worker")

TRACEBACK_LINES = 20
ERROR_CHARS = 4000
NAMES_SHOWN = 50  # registered names listed in an unknown-name error
# where handlers run (docs/howto/process-pool.md, docs/howto/async-handlers.md#the-async-pool)
POOLS = ("thread", "process", "async")
# tracing's frames around a handler: the same in every error, left out of it
_AROUND = (attempt.__code__, attempt_async.__code__)


def error_text(exc: BaseException, below_caller: bool = False) -> str:
    """A failed job's error: ``"ExcType: message"``, a newline, then the last
    ``TRACEBACK_LINES`` lines of the formatted traceback; at most
    ``ERROR_CHARS`` characters in all (the summary line is kept whole up to
    1,000 characters). ``below_caller``: the traceback starts below its
    first frame (the worker's own call of the handler, the same in every
    job's error: ~130 bytes of each dead row), and below tracing's frame
    around the handler (``tracing/spans.py``), when there is one below it;
    an exception raised in that frame itself keeps it."""
    try:
        head = f"{type(exc).__name__}: {exc}"[:1000]
        tb = exc.__traceback__
        if below_caller and tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
            if tb.tb_frame.f_code in _AROUND and tb.tb_next is not None:
                tb = tb.tb_next  # tracing's frame around the handler, the same in every error
        lines = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip().splitlines()
    except Exception as err:
        return f"{type(exc).__name__}: (could not format the error: {type(err).__name__})"
    if len(lines) > TRACEBACK_LINES:
        lines = [
            f"... ({len(lines) - TRACEBACK_LINES} traceback lines trimmed)",
            *lines[-TRACEBACK_LINES:],
        ]
    body = "\n".join(lines)
    room = ERROR_CHARS - len(head) - 1
    if len(body) > room:
        body = "..." + body[len(body) - room + 3 :]
    return f"{head}\n{body}"


def failed(finished, exc: BaseException, mq) -> None:
    """Set ``finished`` (a ``reporter.Finished``) from the exception its
    handler raised, caught in the frame that called the handler (its error
    starts below it): ``Unrecoverable`` dead at once; ``RateLimited`` and
    ``MoveToDelayed`` back later without spending the attempt
    (docs/howto/priorities-rate-limits.md#rate-limits, docs/howto/step-jobs.md);
    ``WaitForChildren`` held until its children resolve; anything else
    retried, or not, by its policy (docs/howto/retries.md). ``mq``: the
    worker's ``EchoMQ``."""
    if isinstance(exc, Unrecoverable):
        finished.error, finished.dead = error_text(exc, below_caller=True), True
    elif isinstance(exc, RateLimited):
        finished.postpone_ms = exc.retry_after_ms
    elif isinstance(exc, MoveToDelayed):
        finished.postpone_ms = exc.delay_ms
    elif isinstance(exc, WaitForChildren):
        finished.wait_children = True
    else:
        finished.error = error_text(exc, below_caller=True)
        decided(finished, exc, mq.queues, mq.wire.backoff_cap_ms)


def pool_kind(pool: str, max_jobs_per_child, max_memory_per_child) -> str:
    """``pool`` checked, with the recycling limits that only a process pool
    takes (docs/howto/process-pool.md#recycling). Raises ``ValueError``
    naming the choices or the rule."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    for what, value in (
        ("max_jobs_per_child", max_jobs_per_child),
        ("max_memory_per_child", max_memory_per_child),
    ):
        if value is None:
            continue
        if pool != "process":
            raise ValueError(f"{what} applies to the process pool only (pool='process')")
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return pool


def unknown_name_error(name: str) -> str:
    """The error of a job whose name has no handler: names it and the
    registered ones (the first ``NAMES_SHOWN``, the closest to it first). A Django ``@task`` job
    (``echomq_django.task``) says what is true instead: this worker process
    has no tasks backend loaded (it started before the framework was
    importable, or without it), and what to do.
    docs/howto/tasks-backend.md"""
    if name == TASK_JOB_NAME:
        return _no_tasks_backend_error()
    names = registered()
    close = difflib.get_close_matches(name, names, n=NAMES_SHOWN, cutoff=0.5)
    names = close + [n for n in names if n not in close]  # the likeliest typo first
    shown = ", ".join(names[:NAMES_SHOWN]) or "(none)"
    if len(names) > NAMES_SHOWN:
        shown += f", ... ({len(names) - NAMES_SHOWN} more)"
    return (
        f"UnknownJobName: no handler is registered for job name {name!r}; registered: "
        f"{shown}. Register one with @echomq_django.handler({name!r}) in an installed "
        "app's jobs.py"
    )


def unknown_name(job, warned: set[str]) -> str:
    """The error of ``job``, whose name has no handler (``unknown_name_error``):
    logged as a WARNING once per name (``warned``: the names said already,
    the runner's), and recorded as the attempt's span when traced
    (``tracing.spans.refused_attempt``)."""
    error = unknown_name_error(job.name)
    if job.name not in warned:
        warned.add(job.name)
        log.warning("%s", error)
    refused_attempt(job, error)
    return error


def _no_tasks_backend_error() -> str:
    """Why a worker has no handler for Django tasks, and the fix."""
    now = tasks_framework()
    fix = (
        f"{now} is importable now: restart this worker to load it"
        if now
        else "install it (Django 5.2: pip install django-tasks; Django 6 has django.tasks), "
        "then restart this worker"
    )
    return (
        f"UnknownJobName: this worker has no handler for Django tasks (job name "
        f"{TASK_JOB_NAME!r}): the tasks backend (echomq_django.tasks) was not loaded in this "
        f"worker process, as no tasks framework was importable when it started; {fix}"
    )


def decided(finished: Finished, exc: BaseException, queues: dict, cap_ms: int) -> Finished:
    """Apply the job's retry policy (docs/howto/retries.md) to a failed
    attempt: ``exc`` is what the handler raised, ``queues`` the queues'
    settings, ``cap_ms`` the longest wait (ms). Sets ``dead`` (an exception
    the policy does not retry) and ``delay_ms``; a bad backoff function's
    problem is logged and appended to ``error``. Returns ``finished``."""
    job = finished.job
    opts = queues.get(job.queue) or {}
    d = decide(exc, job.attempts, job.backoff_ms, cap_ms, opts, job.retry_policy)
    finished.dead, finished.delay_ms = finished.dead or d.dead, d.delay_ms
    if d.note:
        log.error("job %s/%s (%s): %s", job.queue, job.id, job.name, d.note)
        finished.error = f"{finished.error}\n{d.note}"
    return finished


_opened = threading.local()  # n: database connections Django opened on the thread, counted
# JobConnections.after() looks at least at the first job's end this long (s) after its last
# look, whatever else says nothing changed (a backstop: see the class)
LOOK_S = 1.0


def _count_opened(sender, connection, **kwargs) -> None:
    """``connection_created``'s receiver: one more connection opened on this thread."""
    _opened.n = getattr(_opened, "n", 0) + 1


connection_created.connect(_count_opened, weak=False, dispatch_uid="echomq_django.pool.opened")


def _every_connection() -> list:
    """Each alias's connection object on this thread, made if need be; an alias whose
    backend cannot load here (``ImproperlyConfigured``) has none, and none can be open."""
    made = []
    for alias in connections:
        try:
            made.append(connections[alias])
        except ImproperlyConfigured:
            continue
    return made


class JobConnections:
    """Django's rule for a request's database connections, kept around each
    job on a thread that runs jobs one after another: ``before()`` and
    ``after()`` are ``django.db.close_old_connections()`` (a connection past
    its ``CONN_MAX_AGE``, or unusable after an error, is closed; the next
    query opens a fresh one), the way ``request_started`` and
    ``request_finished`` call it. ``before()`` skips the call when it could
    close nothing: nothing runs on that thread between two jobs, so after its
    last ``after()`` only the clock moves, and then only a connection left
    open whose ``close_at`` has passed is closed. About 4 µs a job with no
    connection, 8 with one (Django 5.2, each call); handler threads that
    never touch the database pay one call a job instead of two.

    ``after()`` skips its look as well when its last look left no connection
    open and, since then, none of the thread's connection objects (each
    alias's, made by that look) holds one, no ``connection_created`` was sent
    on the thread (a connection object made anew), and less than ``LOOK_S``
    (1 s) passed: there is nothing to close. A connection whose setup raised
    after Django set it (``connect()`` sends the signal last) is seen by the
    first test (docs/howto/deploy.md#database-connections)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before(self) -> None:
        """``close_old_connections()`` when it may close something (see the class)."""
        until = getattr(self._local, "until", 0.0)  # a thread's first job: look
        if until is not None and time.monotonic() >= until:
            close_old_connections()

    def after(self) -> None:
        """``close_old_connections()`` unless it could close nothing (see the
        class), noting what the next ``before()`` must look at: no connection
        open (None), or the earliest ``close_at`` of those open (monotonic s;
        inf: kept for good). Raises what closing a connection raised."""
        here, opened = self._local, getattr(_opened, "n", 0)
        skip = getattr(here, "skip", None)  # (count, until when, the connection objects)
        if (
            skip is not None
            and skip[0] == opened
            and time.monotonic() < skip[1]
            and all(conn.connection is None for conn in skip[2])
        ):
            return  # none open before the job, none opened by it
        here.until, here.skip = 0.0, None  # until this call has finished: look
        until = None
        made = _every_connection()
        for conn in made:  # close_old_connections' own loop
            conn.close_if_unusable_or_obsolete()
            if conn.connection is not None:
                at = float("inf") if conn.close_at is None else conn.close_at
                until = at if until is None else min(until, at)
        here.until = until
        if until is None:
            here.skip = (opened, time.monotonic() + LOOK_S, made)


def run_handler(loop, job, done) -> None:
    """On a handler thread: run ``job``'s handler for ``loop`` (a
    ``claim_loop.ClaimLoop``: its time limits, timeouts, database connections,
    pool), then each job its completion claimed on the direct path
    (direct.py); every job's ``Finished`` (or None, past its time limit) is
    reported on that path or posted to ``done`` (the loop's ``wake.Inbox``)."""
    while job is not None:
        job = _run_one(loop, job, done)


def _run_one(loop, job, done):
    """``run_handler`` for one job; returns the next one, or None."""
    finished, started, nxt = Finished(job), time.perf_counter(), None
    limit_ms = job.timeout_ms or loop.time_limits[job.queue]
    loop.timeouts.start(job, limit_ms)
    try:
        loop.connections.before()
        func = get_handler(job.name)
        if func is None:
            finished.error = unknown_name(job, loop.warned)
        else:
            finished.result = attempt(func, job)  # in a span when traced
    except BaseException as exc:  # dead, postponed, waiting or retried: pool.failed
        failed(finished, exc, loop.mq)
    finally:
        try:
            loop.connections.after()
        except Exception:
            log.exception("close_old_connections() failed after job %s/%s", job.queue, job.id)
        finished.ms = (time.perf_counter() - started) * 1000
        # its time limit passed first: failed already (a job without one never is)
        if limit_ms is not None and not loop.timeouts.settle(job):
            loop.pool.retire_current()
            done.put(None)  # a stopping loop waits for written-off handlers too
            log.warning(
                "job %s/%s (%s): the handler returned %.0f ms after its time limit of "
                "%d ms (it ran %.0f ms); its result is discarded",
                *(job.queue, job.id, job.name, finished.ms - limit_ms, limit_ms, finished.ms),
            )
        elif sys.exc_info()[1] is not None:  # pool.failed raised: the loop's, then the log
            done.put(finished)
        else:
            nxt = loop.direct.finish(finished, done)
    return nxt


class HandlerPool:
    """``size`` handler threads taking ``(fn, args)`` from one queue, started
    when the first job arrives, on a thread of their own, so the loop hands
    its first jobs over without waiting for a thread start
    (docs/explanation/performance.md#a-workers-start); more start as a resize or
    a written-off handler makes room, when a job arrives. Handler threads are
    daemons when the thread that made the pool is one. Cheaper per job than
    ``ThreadPoolExecutor.submit`` (no Future, Condition or semaphore per job;
    that was a quarter of the loop thread's time on small jobs, docs/explanation/performance.md).
    ``fn`` reports its own outcome and never raises (``run_handler``).
    ``run(job, done)``: what ``start(job, done)`` runs on a thread (the same
    calls as ``processes.supervisor.ProcessPool``'s)."""

    kind = "thread"
    ahead = 0  # jobs it takes beyond one per handler (a process pool queues some)

    def __init__(self, size: int, name: str, run=None) -> None:
        self._size, self._name, self._run = size, name, run
        self._jobs: _queue.SimpleQueue = _queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards _size and _threads (write_off, retire)
        self._local = threading.local()
        self._started = self._written_off = 0
        self._closed, self._filling = False, False
        self._daemon = threading.current_thread().daemon  # as when the loop started them

    def submit(self, fn, *args) -> None:
        self._jobs.put((fn, args))
        if self._filling or len(self._threads) >= self._size:
            return
        if self._started:
            self._grow()
        else:  # the first job: the rest start on their own thread
            self._filling = True  # before it runs: it clears the flag as it ends
            try:
                threading.Thread(target=self._fill, name=f"{self._name}-start", daemon=True).start()
            except BaseException:  # no thread to be had: raised, as a handler's start was
                self._filling = False
                raise

    def _fill(self) -> None:
        """(Its own thread) start threads until the pool is full; from then on a
        job that finds room starts one itself, and room made as this ended is filled."""
        try:
            while self._grow():
                pass
        finally:
            self._filling = False
        while self._grow():
            pass

    def _grow(self) -> bool:
        """Start one more thread when there is room for it (False: none, or shut)."""
        with self._lock:  # a thread in _threads has started: shutdown may join it
            if self._closed or len(self._threads) >= self._size:
                return False
            name = f"{self._name}_{self._started}"
            thread = threading.Thread(target=self._work, name=name, daemon=self._daemon)
            self._started += 1
            self._threads.append(thread)
            thread.start()
        return True

    def start(self, job, done) -> None:
        """Run ``run(job, done)`` on a handler thread."""
        self.submit(self._run, job, done)

    @property
    def size(self) -> int:
        """Handler threads running jobs at once (written-off ones aside)."""
        return self._size - self._written_off

    def resize(self, size: int) -> None:
        """Run ``size`` (>= 1) handlers at once: more threads start as jobs
        arrive; threads beyond it leave after their current job."""
        with self._lock:
            self._size = size + self._written_off
            drop = len(self._threads) - self._size  # started ones only: others never start
        for _ in range(max(0, drop)):
            self._jobs.put(None)

    def write_off(self, job=None) -> str:
        """A thread is stuck in ``job``'s handler past its time limit
        (timeouts.py): one more thread may start, so ``size`` handlers keep
        running; the stuck one leaves once its handler returns
        (``retire_current``, called from that handler's thread). Returns
        what the timeout error says became of the handler."""
        with self._lock:
            self._size += 1
            self._written_off += 1
        return "the handler's late result is discarded"

    def retire_current(self) -> None:
        """The calling handler thread (a written-off one) leaves the pool
        once its current job returns."""
        self._local.retire = True

    def _work(self) -> None:
        get = self._jobs.get
        while True:
            item = get()
            if item is None:
                with self._lock:
                    self._threads.remove(threading.current_thread())
                return
            try:
                item[0](*item[1])
            except BaseException:
                log.exception("a handler thread's job raised")
            if getattr(self._local, "retire", False):
                with self._lock:
                    self._size -= 1
                    self._written_off -= 1
                    self._threads.remove(threading.current_thread())
                return

    def shutdown(self, wait: bool) -> None:
        """Drop the jobs not started yet (their leases cover them), stop every
        thread once its current job is done; ``wait``: join them."""
        try:
            while True:
                self._jobs.get_nowait()
        except _queue.Empty:
            pass
        with self._lock:
            self._closed, threads = True, list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        if wait:
            for thread in threads:
                thread.join()
