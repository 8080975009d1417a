"""The worker: claim jobs, run their handlers on a thread pool, report back in
batches (DESIGN §4, §7, §8; issue "Workers").

``Worker(["orders"], concurrency=4).run(burst=False, max_jobs=None)``

Three kinds of thread share the work, and only two of them talk to Redis on
the job path, each in batches:

* the **loop** (the thread that calls ``run()``) claims as many jobs as there
  are free handler threads, round-robin over the queues (the first queue
  asked rotates each turn; a queue whose claim came back short rests for
  ``poll_interval`` unless a parent on it is released), submits them, and
  waits for the next one to finish;
* the **reporter** takes every finished job handed over since its last batch
  and reports them: one pipelined ``complete_many`` and one ``fail_many`` (one
  round trip each, however many jobs), then sends the Django signals for that
  batch (``close_old_connections()`` around it, for receivers that use the
  database). While Redis runs one side's scripts, Python does the other's work:
  that overlap, and the batching, are where the throughput comes from;
* ``concurrency`` **handler** threads (``_Pool``: one queue of jobs, no
  Future per job) run the handlers, with
  ``django.db.close_old_connections()`` before and after each call.

A heartbeat thread extends the lease of every job that has run for a third of
it. Signal receivers run on the reporter thread.

Decisions (documented here, relied on by the tests):

* A handler that raises ``echomq_django.Unrecoverable`` fails the job for
  good: dead at once, its remaining attempts unspent (BullMQ's
  UnrecoverableError); its parent's policy applies.
* A handler that raises fails the job with ``"ExcType: message"`` then the
  last ``TRACEBACK_LINES`` lines of the traceback (at most ``ERROR_CHARS``
  characters); the job retries with backoff and dies when its attempts are
  spent, and its parent's policy applies (DESIGN §4).
* A job whose name has no handler is an ordinary failure too (retries, then
  dead), not an instant death: a deploy that adds the handler recovers the
  retries still due, and retry-by-id recovers the dead ones. The error names
  the job name and the registered names.
* A result that is not JSON-serialisable (or too large) fails the job with
  ``"PayloadError: ..."``, the same way.
* ``LeaseLost`` / ``JobNotActive`` / ``JobNotFound`` when reporting mean the
  lease expired and the pump recovered the job (it runs again): a WARNING,
  the result is dropped, the worker goes on.
* Redis unreachable: "Redis unreachable at ..., retrying in Xs" at WARNING,
  backoff doubling from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S``; no claims
  meanwhile; finished results are kept and reported once Redis answers. No job
  is acknowledged without Redis, so a job held is never lost: at worst its
  lease expires and the pump recovers it.
* Burst mode stops when nothing is running and a claim on every queue finds
  nothing; delayed jobs (backoff, scheduled) are not waited for.
* Stop (``stop()``, or SIGTERM/SIGINT when ``run()`` is on the main thread):
  no more claims; running jobs finish and are reported within
  ``shutdown_timeout`` seconds. A second signal (``stop(force=True)``) returns
  at once. Jobs still running then are left to their leases (the heartbeat
  stops; the pump recovers them) and counted in ``abandoned``.

Logging (logger ``echomq_django.worker``): INFO a start line, a throughput
line every ``STATS_EVERY_S`` seconds while busy and a stop line; DEBUG a line
per job; WARNING lost leases, unknown job names (once per name), dead jobs
and Redis outages. Nothing per job is formatted unless DEBUG is enabled.
"""

from __future__ import annotations

import logging
import queue as _queue
import signal
import threading
import time
import traceback

import redis
from django.db import close_old_connections

from . import signals
from .client import EchoMQ
from .conf import get_mq
from .exceptions import (
    JobNotActive,
    JobNotFound,
    LeaseLost,
    PayloadError,
    RedisUnavailable,
    Unrecoverable,
    describe,
)
from .handlers import get_handler, registered
from .jobs import Job, JobState
from .keyspace import validate_queue

log = logging.getLogger("echomq_django.worker")

REDIS_DOWN = (
    RedisUnavailable,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
)
GONE = (LeaseLost, JobNotActive, JobNotFound)
TRACEBACK_LINES = 20
ERROR_CHARS = 4000
BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0
STATS_EVERY_S = 5.0
NAMES_SHOWN = 50  # registered names listed in an unknown-name error


class _DeadError(str):
    """The error text of a handler that raised ``Unrecoverable``."""


def error_text(exc: BaseException) -> str:
    """A failed job's error: ``"ExcType: message"``, a newline, then the last
    ``TRACEBACK_LINES`` lines of the formatted traceback; at most
    ``ERROR_CHARS`` characters in all (the summary line is kept whole up to
    1,000 characters)."""
    try:
        head = f"{type(exc).__name__}: {exc}"[:1000]
        lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
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


def unknown_name_error(name: str) -> str:
    """The error of a job whose name has no handler: names it and the
    registered ones (the first ``NAMES_SHOWN``)."""
    names = registered()
    shown = ", ".join(names[:NAMES_SHOWN]) or "(none)"
    if len(names) > NAMES_SHOWN:
        shown += f", ... ({len(names) - NAMES_SHOWN} more)"
    return (
        f"UnknownJobName: no handler is registered for job name {name!r}; registered: "
        f"{shown}. Register one with @echomq_django.handler({name!r}) in an installed "
        "app's jobs.py"
    )


class Worker:
    """Runs the handlers of jobs claimed from ``queues`` (DESIGN §7).

    ``queues``: queue names (list of str); ``concurrency``: handler threads
    (int >= 1); ``mq``: an ``EchoMQ`` (None: the one built from settings);
    ``batch``: most jobs claimed per ``claim`` call (default ``concurrency``);
    ``lease_ms`` (ms): lease length for every queue (default each queue's
    ``LEASE_MS``); ``heartbeat_ms`` (ms): how often running jobs are checked
    for a lease extension (default a sixth of the shortest lease, at least
    50); ``shutdown_timeout`` (s): how long a graceful stop waits for running
    jobs; ``poll_interval`` (s): how long an empty queue rests before it is
    claimed from again. Raises ``ValueError`` for a bad queue name or number.

    After ``run()``: ``processed`` (jobs completed or failed, all runs),
    ``stats`` (``completed``, ``failed`` = will retry, ``dead``, ``lost`` =
    dropped after their lease expired) and ``abandoned`` (jobs still running
    when the last run returned).
    """

    def __init__(
        self,
        queues: list[str],
        concurrency: int = 1,
        mq: EchoMQ | None = None,
        *,
        batch: int | None = None,
        lease_ms: int | None = None,
        heartbeat_ms: int | None = None,
        shutdown_timeout: float = 30.0,
        poll_interval: float = 0.2,
    ) -> None:
        mq = self.mq = mq if mq is not None else get_mq()
        self.queues = [validate_queue(q) for q in dict.fromkeys(queues)]
        if not self.queues:
            raise ValueError("a worker needs at least one queue")
        self.concurrency = _at_least(1, concurrency, "concurrency")
        self.batch = _at_least(1, batch if batch is not None else concurrency, "batch")
        self.leases = {
            q: _at_least(
                1, lease_ms if lease_ms is not None else mq.setting(q, "LEASE_MS"), "lease_ms"
            )
            for q in self.queues
        }
        beat = heartbeat_ms if heartbeat_ms is not None else max(50, min(self.leases.values()) // 6)
        self.heartbeat_s = _at_least(1, beat, "heartbeat_ms") / 1000
        if shutdown_timeout < 0 or poll_interval <= 0:
            raise ValueError("shutdown_timeout must be >= 0 s and poll_interval > 0 s")
        self.shutdown_timeout = float(shutdown_timeout)
        self.poll_interval = float(poll_interval)
        self.processed = 0
        self.stats = {"completed": 0, "failed": 0, "dead": 0, "lost": 0}
        self.abandoned = 0
        self._running: dict[tuple[str, str], Job] = {}  # claimed, not yet reported
        self._lock = threading.Lock()  # guards _running
        self._cv = threading.Condition()  # guards _inbox, _reporting, _closing
        self._inbox: list[tuple] = []  # finished, handed to the reporter
        self._reporting = 0  # handed to the reporter and not reported yet
        self._executing = 0  # submitted to the pool and not finished (loop thread only)
        self._closing = False
        self._halt = threading.Event()  # set when run() returns: helpers stop
        self._done: _queue.SimpleQueue = _queue.SimpleQueue()  # (job, ok, value, ms) or None
        self._stopping = threading.Event()
        self._force = False
        self._stop_at = 0.0
        self._rest = dict.fromkeys(self.queues, 0.0)  # queue -> monotonic time it may be claimed
        # queue -> parents this worker saw released on it (written by the reporter only): a
        # claim that came back short rests its queue only if none was released meanwhile
        self._released = dict.fromkeys(self.queues, 0)
        self._turn = 0
        self._warned: set[str] = set()
        self._debug = False
        self._stats_at, self._stats_seen = 0.0, (0, time.monotonic())

    # -- control -------------------------------------------------------------
    def stop(self, force: bool = False) -> None:
        """Stop claiming; ``run()`` returns once the running jobs are reported
        (or ``shutdown_timeout`` s have passed). ``force``: return at once,
        leaving running jobs to their leases. Safe from any thread and from a
        signal handler."""
        if not self._stopping.is_set():
            self._stop_at = time.monotonic() + self.shutdown_timeout
            self._stopping.set()
        if force:
            self._force = True
        self._done.put(None)  # wake the loop

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._stopping.is_set():
            log.warning(
                "%s again: stopping now; %d running jobs are left to their leases",
                name,
                len(self._running),
            )
            self.stop(force=True)
        else:
            log.warning(
                "%s: no more claims; finishing %d running jobs (up to %.0fs); send it "
                "again to stop at once",
                name,
                len(self._running),
                self.shutdown_timeout,
            )
            self.stop()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]

    # -- the loop ------------------------------------------------------------
    def run(self, burst: bool = False, max_jobs: int | None = None) -> int:
        """Process jobs until stopped; returns how many this run completed or
        failed. ``burst``: return once the queues are empty; ``max_jobs``:
        claim no more than this many, then return when they are reported.
        Installs SIGTERM/SIGINT handlers when called on the main thread
        (restored on return). Redis outages are waited out, never raised."""
        if max_jobs is not None and max_jobs < 0:
            raise ValueError(f"max_jobs must be >= 0, got {max_jobs}")
        restore = self._install_signals()
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._pool = _Pool(self.concurrency, "echomq-worker")
        # Fresh per run: handlers abandoned by an earlier run post to the old queue.
        self._done, self._inbox, self._reporting = _queue.SimpleQueue(), [], 0
        self._closing, self._executing = False, 0
        self._halt.clear()
        helpers = [
            threading.Thread(target=target, daemon=True, name=name)
            for target, name in (
                (self._heartbeat, "echomq-heartbeat"),
                (self._reporter, "echomq-reporter"),
            )
        ]
        for thread in helpers:
            thread.start()
        start = self.processed
        log.info(
            "worker started: queues %s, concurrency %d, lease %s ms",
            ", ".join(self.queues),
            self.concurrency,
            ", ".join(f"{q}={ms}" for q, ms in self.leases.items()),
        )
        try:
            self._loop(burst, max_jobs)
        finally:
            with self._cv:
                self._closing = True
                self._cv.notify_all()
            self._halt.set()
            for thread in helpers:  # daemons: one stuck on a dead socket is left behind
                thread.join(timeout=0 if self._reporting else 2.0)
            self.abandoned = len(self._running)
            self._pool.shutdown(wait=not self.abandoned)
            restore()
            self._log_stats(time.monotonic())
            if self.abandoned:
                log.warning(
                    "stopped with %d jobs still running; their leases will expire and "
                    "the pump recovers them",
                    self.abandoned,
                )
            log.info("worker stopped: processed %d jobs this run", self.processed - start)
            self._stopping.clear()
            self._force = False
        return self.processed - start

    def _loop(self, burst: bool, max_jobs: int | None) -> None:
        """Claim and submit; hand finished jobs to the reporter thread."""
        claimed, retry_at, outage = 0, 0.0, _Outage(self.mq.client)
        self._stats_at = time.monotonic() + STATS_EVERY_S
        self._stats_seen = (self.processed, time.monotonic())
        while not self._force:
            now = time.monotonic()
            got, asked = 0, False
            limit = self.concurrency if max_jobs is None else max_jobs - claimed
            if now >= retry_at and not self._stopping.is_set() and limit > 0:
                free = min(self.concurrency - self._executing, limit)
                asked = burst and not self._executing and not self._reporting
                try:
                    got = self._claim(free, everywhere=asked) if free > 0 else 0
                except REDIS_DOWN as err:
                    retry_at, asked = now + outage.failed(err), False
                else:
                    retry_at = 0.0
                    if free > 0:
                        outage.ok()
                claimed += got
            if not self._executing and not self._reporting:
                if self._stopping.is_set() or (max_jobs is not None and claimed >= max_jobs):
                    return
                if asked and got == 0:
                    return  # burst: every queue empty, nothing running or unreported
            if self._stopping.is_set() and now >= self._stop_at:
                return
            if now >= self._stats_at:
                self._log_stats(now)
            if got and self._executing < self.concurrency and not asked:
                continue  # a queue gave all we asked: there may be more right away
            wait = max(0.0, retry_at - now) if retry_at else self.poll_interval
            if self._stopping.is_set():
                wait = min(wait, max(0.0, self._stop_at - now))
            self._wait(wait)

    def _wait(self, timeout: float) -> None:
        """Block until a job finishes (or ``timeout`` s, or a wake-up), then
        hand every finished job to the reporter."""
        try:
            item = self._done.get(timeout=timeout)
        except _queue.Empty:
            return
        finished = []
        while True:
            if item is not None:
                finished.append(item)
            try:
                item = self._done.get_nowait()
            except _queue.Empty:
                break
        if finished:
            self._executing -= len(finished)
            with self._cv:
                self._inbox.extend(finished)
                self._reporting += len(finished)
                self._cv.notify()

    def _claim(self, free: int, everywhere: bool) -> int:
        """Claim up to ``free`` jobs round-robin over the queues and submit
        them; ``everywhere`` asks resting queues too. Returns how many."""
        got, now, n = 0, time.monotonic(), len(self.queues)
        first, self._turn = self._turn, (self._turn + 1) % n
        for i in range(n):
            if free <= 0:
                break
            queue = self.queues[(first + i) % n]
            if not everywhere and self._rest[queue] > now:
                continue
            want = min(free, self.batch)
            released = self._released[queue]
            jobs = self.mq.claim(queue, want, self.leases[queue])
            if len(jobs) < want and self._released[queue] == released:
                # (a parent released after this claim ran would wait out the rest)
                self._rest[queue] = now + self.poll_interval
            with self._lock:
                for job in jobs:
                    self._running[(queue, job.id)] = job
            self._executing += len(jobs)
            for job in jobs:
                self._pool.submit(self._execute, job, self._done)
            free -= len(jobs)
            got += len(jobs)
        return got

    # -- on a pool thread ----------------------------------------------------
    def _execute(self, job: Job, done: _queue.SimpleQueue) -> None:
        """Run one handler; always posts ``(job, ok, result or error, ms)`` to
        ``done``."""
        ok, value, started = False, None, time.perf_counter()
        try:
            close_old_connections()
            func = get_handler(job.name)
            if func is None:
                value = unknown_name_error(job.name)
                if job.name not in self._warned:
                    self._warned.add(job.name)
                    log.warning("%s", value)
            else:
                value, ok = func(job), True
        except Unrecoverable as exc:  # dead at once, attempts left or not
            value = _DeadError(error_text(exc))
        except BaseException as exc:
            value = error_text(exc)
        finally:
            try:
                close_old_connections()
            except Exception:
                log.exception("close_old_connections() failed after job %s/%s", job.queue, job.id)
            done.put((job, ok, value, (time.perf_counter() - started) * 1000))

    # -- reporting (the reporter thread) ---------------------------------------
    def _reporter(self) -> None:
        """Report what the loop hands over, batch by batch, while the loop
        claims: Redis runs one side's scripts while Python does the other's
        work. Waits out an outage keeping the batch; wakes the loop after
        each batch (a released parent may be claimable now)."""
        items: list[tuple] = []
        outage = _Outage(self.mq.client)
        while True:
            with self._cv:
                while not self._inbox and not items and not self._closing:
                    self._cv.wait()
                if self._closing:  # the loop is done, or gave up: leases cover the rest
                    return
                items.extend(self._inbox)
                self._inbox.clear()
            before = len(items)
            try:
                close_old_connections()  # signal receivers may use the database
                self._report(items)
                close_old_connections()
            except REDIS_DOWN as err:
                delay = outage.failed(err)
                with self._cv:
                    self._cv.wait_for(lambda: self._closing, timeout=delay)
            except Exception:  # a bug must not stall the loop's accounting
                log.exception(
                    "reporting %d jobs failed; their leases will expire and the pump recovers them",
                    len(items),
                )
                self._forget(*(item[0] for item in items))
                items.clear()
            else:
                outage.ok()
            with self._cv:
                self._reporting -= before - len(items)
            self._done.put(None)

    def _report(self, finished: list) -> None:
        """Complete and fail every finished job: one round trip each. Items
        leave ``finished`` only once Redis has answered for them, so a
        ``RedisUnavailable`` (propagated) loses nothing."""
        if not finished:
            return
        good = [f for f in finished if f[1]]
        if good:
            replies = self.mq.complete_many([(f[0], f[2]) for f in good])
            finished[:] = [f for f in finished if not f[1]]
            done = []
            for item, reply in zip(good, replies, strict=False):
                if isinstance(reply, PayloadError):
                    finished.append((item[0], False, f"PayloadError: {reply}", item[3]))
                elif isinstance(reply, Exception):
                    self._drop(item[0], reply)
                else:
                    done.append((item, reply))
            self._completed(done)
        if finished:
            try:
                replies = self.mq.fail_many(
                    [(f[0], f[2], isinstance(f[2], _DeadError)) for f in finished]
                )
            except REDIS_DOWN:
                raise
            except Exception as err:
                replies = [err]
            items, finished[:] = list(finished), []
            self._failed(
                [(i, r) for i, r in zip(items, replies, strict=False) if not self._drop(i[0], r)]
            )

    def _drop(self, job: Job, reply) -> bool:
        """Forget a job Redis refused to complete or fail; True if it was."""
        if not isinstance(reply, Exception):
            return False
        self._forget(job)
        self.stats["lost"] += 1
        if isinstance(reply, GONE):
            log.warning(
                "job %s/%s (%s): result dropped, the lease was lost: %s",
                job.queue,
                job.id,
                job.name,
                reply,
            )
        else:
            log.error(
                "job %s/%s (%s): Redis refused the result: %r; the lease will expire "
                "and the pump recovers it",
                job.queue,
                job.id,
                job.name,
                reply,
            )
        return True

    def _forget(self, *jobs: Job) -> None:
        with self._lock:
            for job in jobs:
                self._running.pop((job.queue, job.id), None)

    def _completed(self, done: list) -> None:
        listening = signals.job_completed.has_listeners(self)
        self._forget(*(item[0] for item, _ in done))
        for (job, _, result, ms), outcome in done:
            if self._debug:
                log.debug("job %s/%s (%s) completed in %.1f ms", job.queue, job.id, job.name, ms)
            if listening:
                signals.send(
                    signals.job_completed,
                    self,
                    queue=job.queue,
                    job_id=job.id,
                    job_name=job.name,
                    result=result,
                )
            self._after(job, outcome)
        self.stats["completed"] += len(done)
        self.processed += len(done)

    def _failed(self, failed: list) -> None:
        listening = (signals.job_failed.has_listeners(self), signals.job_dead.has_listeners(self))
        self._forget(*(item[0] for item, _ in failed))
        for (job, _, error, ms), outcome in failed:
            dead = outcome.state is JobState.DEAD
            self.stats["dead" if dead else "failed"] += 1
            if dead:
                log.warning(
                    "job %s/%s (%s) is dead after %d attempts: %s",
                    job.queue,
                    job.id,
                    job.name,
                    job.attempts,
                    _first_line(error),
                )
            elif self._debug:
                log.debug(
                    "job %s/%s (%s) failed in %.1f ms (attempt %d of %d, %s): %s",
                    job.queue,
                    job.id,
                    job.name,
                    ms,
                    job.attempts,
                    job.max_attempts,
                    outcome.state,
                    _first_line(error),
                )
            if listening[dead]:
                kwargs = {
                    "queue": job.queue,
                    "job_id": job.id,
                    "job_name": job.name,
                    "error": error,
                }
                if not dead:
                    kwargs["run_at"] = outcome.run_at
                signals.send(signals.job_dead if dead else signals.job_failed, self, **kwargs)
            self._after(job, outcome)
        self.processed += len(failed)

    def _after(self, job: Job, outcome) -> None:
        """Wake queues where a parent was released; signal what else moved."""
        if outcome.released or outcome.dead or outcome.flow_failed:
            for queue, _ in outcome.released:
                if queue in self._rest:
                    self._released[queue] += 1
                    self._rest[queue] = 0.0
            signals.send_outcome(self, self.mq, outcome, skip=(job.queue, job.id))

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

    # -- heartbeat -----------------------------------------------------------
    def _heartbeat(self) -> None:
        """Extend the lease of each job that has used a third of it."""
        while not self._halt.wait(self.heartbeat_s):
            now = self.mq.clock()
            with self._lock:
                jobs = list(self._running.values())
            for job in jobs:
                lease = self.leases[job.queue]
                if job.lease_deadline is None or job.lease_deadline - now > lease * 2 // 3:
                    continue
                try:
                    self.mq.extend_lease(job, lease)
                except GONE as err:
                    # Or just reported by the loop: only reporting knows, and warns.
                    job.lease_deadline = None
                    log.debug("job %s/%s: lease not extended: %s", job.queue, job.id, err)
                except REDIS_DOWN:
                    break  # the loop reports the outage
                except Exception:
                    log.exception("extending the lease of job %s/%s failed", job.queue, job.id)


class _Outage:
    """One thread's view of a Redis outage: logs each failed try with the
    backoff before the next (doubling, capped), and the recovery once."""

    def __init__(self, client) -> None:
        self.where = describe(client)
        self.delay, self.down = BACKOFF_START_S, False

    def failed(self, err: BaseException) -> float:
        """Log the failure; returns the seconds to wait before the next try."""
        delay, self.down = self.delay, True
        log.warning(
            "Redis unreachable at %s (%s), retrying in %.1fs", self.where, _cause(err), delay
        )
        self.delay = min(delay * 2, BACKOFF_MAX_S)
        return delay

    def ok(self) -> None:
        if self.down:
            log.warning("Redis reachable again at %s", self.where)
        self.delay, self.down = BACKOFF_START_S, False


class _Pool:
    """``size`` handler threads taking ``(fn, args)`` from one queue, started
    as the first ``size`` jobs arrive. Cheaper per job than
    ``ThreadPoolExecutor.submit`` (no Future, Condition or semaphore per job;
    that was a quarter of the loop thread's time on small jobs, issue 8).
    ``fn`` reports its own outcome and never raises (``Worker._execute``)."""

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._jobs: _queue.SimpleQueue = _queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, fn, *args) -> None:
        self._jobs.put((fn, args))
        if len(self._threads) < self._size:
            thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}")
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        get = self._jobs.get
        while True:
            item = get()
            if item is None:
                return
            try:
                item[0](*item[1])
            except BaseException:
                log.exception("a handler thread's job raised")

    def shutdown(self, wait: bool) -> None:
        """Drop the jobs not started yet (their leases cover them), stop every
        thread once its current job is done; ``wait``: join them."""
        try:
            while True:
                self._jobs.get_nowait()
        except _queue.Empty:
            pass
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _at_least(low: int, value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    return int(value)


def _cause(err: BaseException) -> str:
    """The driver's own words for a connection error (``RedisUnavailable``
    wraps them with the address, which the log line gives already)."""
    if isinstance(err, RedisUnavailable) and err.__cause__ is not None:
        err = err.__cause__
    return _first_line(err)


def _first_line(value) -> str:
    return str(value).split("\n", 1)[0]
