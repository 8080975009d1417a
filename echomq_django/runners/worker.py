"""The worker: claim jobs, run their handlers on a thread pool, report back in
batches (docs/explanation/house.md#runners-threads-and-loops).

``Worker(["orders"], concurrency=4).run(burst=False, max_jobs=None)``

Three kinds of thread share the work; the loop and the reporter talk to Redis
in batches, a handler only on the direct path (direct.py: it reports the only
claimed job while the reporter idles, and runs the job that report claimed):

* the **loop** (the thread that calls ``run()``) claims as many jobs as there
  are free handler threads, round-robin over the queues (the first queue
  asked rotates each turn; a queue whose claim came back short rests until
  woken), submits them, and waits for one to finish or a wake-up: with a
  free thread it blocks on the queues' wake keys (``wake.Idle``: no polling,
  docs/explanation/no-polling.md), and it keeps the queues' timers (due delayed jobs promoted
  at their run-at, expired leases recovered by one worker per queue per
  ``sweep_interval``), so ``runworker`` alone runs a single-queue site;
* the **reporter** (reporter.py) takes every finished job handed over since
  its last batch and reports them: one pipelined ``complete_many`` and one ``fail_many`` (one
  round trip each, however many jobs), then sends the Django signals for that
  batch (``close_old_connections()`` around it, for receivers that use the
  database). While Redis runs one side's scripts, Python does the other's work:
  that overlap, and the batching, are where the throughput comes from;
* ``concurrency`` **handler** threads (``pool.HandlerPool``: one queue of jobs,
  no Future per job) run the handlers, ``django.db.close_old_connections()``
  before and after each (the one before skipped: ``pool.JobConnections``).

A heartbeat thread extends the lease of every held job (running, or waiting to be reported)
that has run for a third of it, in one round trip; signal receivers run on the reporter
thread. docs/explanation/reliability.md#unreported-jobs-keep-their-leases

Decisions (documented here, relied on by the tests):

* A handler that raises ``echomq_django.Unrecoverable`` fails the job for
  good: dead at once, its remaining attempts unspent (BullMQ's
  UnrecoverableError); its parent's policy applies.
* A handler that raises ``echomq_django.RateLimited(retry_after_ms)`` puts
  the job back (delayed that long) without spending its attempt; a queue
  whose ``RATE_LIMIT`` window is full rests until the window opens
  (docs/explanation/protocol.md#scheduling).
* An attempt that runs past its job's ``timeout_ms`` (or the queue's
  ``TIMEOUT_MS``) fails as timed out and is retried by the usual rules; its
  thread is written off and replaced, its late result discarded
  (timeouts.py says how a thread that never returns is handled).
* A handler that raises fails the job with ``"ExcType: message"`` then the
  last ``TRACEBACK_LINES`` lines of the traceback from the handler's frame
  down (the worker's own call, the same in every error, is left out; at most
  ``ERROR_CHARS`` characters); the job retries with backoff and dies when its attempts are
  spent, and its parent's policy applies (docs/explanation/protocol.md#fail).
* A job whose name has no handler is an ordinary failure too (retries, then
  dead), not an instant death: a deploy that adds the handler recovers the
  retries still due, and retry-by-id recovers the dead ones. The error names
  the job name and the registered names.
* A result that is not JSON-serialisable (or too large) kills the job at
  once with ``"PayloadError: ..."``, its attempts unspent: another attempt
  would repeat the handler's side effects for the same result. Retry it by
  id once the handler (or ``JSON_ENCODER``) is fixed.
* ``LeaseLost`` / ``JobNotActive`` / ``JobNotFound`` when reporting mean the
  lease expired and the pump recovered the job (it runs again): a WARNING,
  the result is dropped, the worker goes on.
* Redis unreachable: "Redis unreachable at ..., retrying in Xs" at WARNING (then one per
  ``SAY_EVERY_S``), backoff from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S`` (the reporter's
  and the wake threads' too); no claims meanwhile, nor while the reporter's batches meet
  it; finished results are kept, leased, and reported once Redis answers. No job
  is acknowledged without Redis, so a claimed job is never lost: at worst its
  lease expires and the pump recovers it. A claim that raised is sent again
  with its own call token, so jobs a lost reply leased come back at once.
* Burst mode first promotes the delayed jobs already due, then stops when
  nothing is running and a claim on every queue finds nothing; a queue whose
  ``RATE_LIMIT`` window is full with jobs waiting is waited out (blocking
  until the window reopens), a paused queue is not, nor are delayed jobs not
  yet due (backoff, scheduled). docs/howto/testing.md#runworker---burst-in-scripts-and-ci
* A worker that stops hands back each queue's earliest delayed run-at it
  learnt (the ``'d'`` wake marker), for the next worker to promote on time.
* Redis dropped under a blocking wait (restart, failover): once it answers
  again every queue is claimed from and every timer runs.
* Stop (``stop()``, or SIGTERM/SIGINT when ``run()`` is on the main thread):
  no more claims; running jobs finish and are reported within
  ``shutdown_timeout`` seconds. Handlers already past their time limit
  (failed as timed out, their threads written off) are waited for too,
  within the same deadline: their side effects get to finish (their results
  are still discarded); so does the end of a burst or ``max_jobs`` run. Not
  when the worker stops because more than ``max_stuck`` are stuck.
  (docs/explanation/reliability.md#stopping-a-worker) A second signal (``stop(force=True)``) returns
  at once. Jobs still running then are left to their leases (the heartbeat
  stops; the pump recovers them) and counted in ``abandoned``.

Logging (logger ``echomq_django.worker``): INFO a start line, a throughput line every
``STATS_EVERY_S`` s while busy and a stop line; DEBUG a line per job; WARNING lost leases,
unknown job names (once per name), dead jobs, Redis outages; per job only under DEBUG.
"""

from __future__ import annotations

import logging
import signal
import threading

from ..conf import get_mq
from ..core.exceptions import JobCancelled
from ..core.jobs import MAX_LEASE_MS
from ..core.keyspace import validate_queue
from ..protocol.client import EchoMQ
from . import heartbeat
from .aio import pool as aio
from .claim_loop import ClaimLoop
from .control.autoscale import Autoscale
from .control.commands import Commands
from .outage import REDIS_DOWN
from .pool import POOLS, pool_kind
from .processes import supervisor as processes
from .reporter import GONE, STATS_EVERY_S
from .timers import SWEEP_S
from .wake import BLOCK_S

__all__ = ["POOLS", "STATS_EVERY_S", "Worker"]

log = logging.getLogger("echomq_django.worker")


class Worker:
    """Runs the handlers of jobs claimed from ``queues`` (docs/explanation/protocol.md#claim).

    ``queues``: queue names (list of str); ``concurrency``: handler threads (int >= 1); ``mq``:
    an ``EchoMQ`` (None: the one built from settings); ``batch``: most jobs claimed per
    ``claim`` call (default ``concurrency``); ``lease_ms`` (ms): lease length for every queue
    (default each queue's ``LEASE_MS``); ``heartbeat_ms`` (ms): how often held jobs are checked
    for a lease extension (default a sixth of the shortest lease, at least 50);
    ``shutdown_timeout`` (s): how long a graceful stop waits for running jobs; ``block_timeout``
    (s, former name ``poll_interval``): the longest single blocking wait on the wake keys;
    ``sweep_interval`` (s) and ``max_stalls``: see ``wake.Timers``; ``max_stuck``: handler
    threads left running past their job's time limit (written off and replaced) before the
    worker stops (default ``concurrency``; timeouts.py); ``register``: list this worker among
    the live processes while it runs (a heartbeat every ``beat_s`` seconds,
    docs/howto/operate.md#live-workers-and-pumps; a listed worker takes operator commands,
    docs/howto/operate-workers.md); ``metrics``: the process's Prometheus counters of finished
    jobs, handler times and dropped or held progress and log writes
    (``monitoring.metrics.process_metrics()``; ``runworker --metrics-port`` passes them), None
    for none; ``drainer``: the commit outbox's drainer (``commit_outbox.Drainer``; ``runworker``
    passes one): it drains once before the first claim, then on its own thread until the worker
    stops (any object with ``drain_once()``, ``start(drain_now=False)`` and ``stop()``);
    ``pool``: ``"thread"`` (handler threads, the default), ``"process"`` (pre-forked handler
    processes, killed past a job's time limit, docs/howto/process-pool.md) or ``"async"`` (one
    event loop running ``concurrency`` handler coroutines,
    docs/howto/async-handlers.md#the-async-pool); with ``"process"``, ``max_jobs_per_child``
    (jobs) and ``max_memory_per_child`` (MiB of resident memory, checked after each job) recycle
    a child, None for no limit; ``autoscale``: ``(MAX, MIN)`` handlers, for any pool: the worker
    starts with MIN (``concurrency`` is ignored) and grows to MAX under a backlog, back when
    idle (autoscale.py, docs/howto/process-pool.md#autoscaling). Raises ``ValueError`` for a bad
    queue name or number, an unknown pool, a recycling limit below 1 or on another pool than the
    process pool, the async pool on asgiref < 3.13, or ``autoscale`` not ``MAX >= MIN >= 1``.
    ``run()`` logs a WARNING naming the known queues when a queue is known nowhere (no job, not
    in settings). Also ``loop`` (its ``ClaimLoop``, which holds the claim state), ``wakeups``,
    ``timers`` (``wake.Idle``), ``waiting`` (true while idle, blocked on its queues) and
    ``process_id`` (its id among the live processes).

    After ``run()``: ``processed`` (jobs completed or failed, all runs), ``stats``
    (``completed``, ``failed`` = will retry, ``dead``, ``lost`` = results refused: lease
    expired, cancelled or removed while running; ``postponed`` = back after ``RateLimited``),
    ``abandoned`` (jobs claimed, unreported when the last run returned: running or finished)
    and ``left_running`` (handlers past their time limit, written off, still running then:
    a process should exit at once, ``os._exit``, as their threads would hold a normal exit).
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
        block_timeout: float | None = None,
        sweep_interval: float = SWEEP_S,
        max_stalls: int = 1,
        poll_interval: float | None = None,
        max_stuck: int | None = None,
        register: bool = True,
        beat_s: float = heartbeat.HEARTBEAT_S,
        metrics=None,
        drainer=None,
        pool: str = "thread",
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        autoscale: tuple[int, int] | None = None,
    ) -> None:
        mq = self.mq = mq if mq is not None else get_mq()
        scale = None if autoscale is None else Autoscale(*autoscale)
        if scale is not None:
            concurrency = scale.low  # grows to scale.high under a backlog
            batch = scale.high if batch is None else batch
            max_stuck = scale.high if max_stuck is None else max_stuck
        self.pool_kind = pool_kind(pool, max_jobs_per_child, max_memory_per_child)
        # the commit outbox: drained before the first claim, then on a
        # thread of its own
        self._drainer = drainer
        self.queues = [validate_queue(q) for q in dict.fromkeys(queues)]
        if not self.queues:
            raise ValueError("a worker needs at least one queue")
        self.concurrency = _at_least(1, concurrency, "concurrency")
        self.batch = _at_least(1, batch if batch is not None else concurrency, "batch")
        self.leases = {
            q: _at_least(
                1,
                lease_ms if lease_ms is not None else mq.setting(q, "LEASE_MS"),
                "lease_ms",
                MAX_LEASE_MS,
            )
            for q in self.queues
        }
        beat = heartbeat_ms if heartbeat_ms is not None else max(50, min(self.leases.values()) // 6)
        self.heartbeat_s = _at_least(1, beat, "heartbeat_ms") / 1000
        block = next((b for b in (block_timeout, poll_interval) if b is not None), BLOCK_S)
        if not 0 <= shutdown_timeout < float("inf"):  # nan and inf too
            raise ValueError(f"shutdown_timeout must be finite, >= 0 s, got {shutdown_timeout!r}")
        if not 0 < block < float("inf"):
            raise ValueError(f"block_timeout must be finite, > 0 s, got {block!r}")
        self.shutdown_timeout = float(shutdown_timeout)
        self.block_timeout = float(block)
        self.abandoned = self.left_running = 0
        self.signalled = False  # SIGTERM or SIGINT reached run() (runworker --burst --pump)
        self.register, self.beat_s, self.metrics = register, beat_s, metrics
        self.max_stuck = _at_least(0, concurrency if max_stuck is None else max_stuck, "max_stuck")
        # per-attempt time limits (timeouts.py): the queues' defaults (ms)
        self.time_limits = {q: mq.queues.get(q, {}).get("TIMEOUT_MS") for q in self.queues}
        self.loop = ClaimLoop(
            mq,
            self.queues,
            concurrency=self.concurrency,
            batch=self.batch,
            leases=self.leases,
            time_limits=self.time_limits,
            max_stuck=self.max_stuck,
            shutdown_timeout=self.shutdown_timeout,
            block_s=block,
            sweep_s=sweep_interval,
            max_stalls=max_stalls,
            sender=self,
            metrics=metrics,
            make_pool=pool_maker(pool, mq, max_jobs_per_child, max_memory_per_child),
        )
        self.loop.scale = scale
        # its id among the live processes, and the key its operator commands come
        # through (docs/howto/operate-workers.md): only a listed worker can be named
        self.process_id = heartbeat.new_process_id()
        if register:
            key = mq.keys.queue(self.queues[0]).commands(self.process_id)
            self.loop.commands = Commands(mq, self.process_id, key, self.loop)
        self.timers, self.wakeups = self.loop.idle.timers, self.loop.idle.wakeups
        self._halt = threading.Event()  # set when run() returns: helpers stop

    @property
    def waiting(self) -> bool:
        """True while idle, blocked on the queues' wake keys."""
        return self.loop.waiting

    @property
    def processed(self) -> int:
        """Jobs completed or failed, all runs."""
        return self.loop.reporter.processed

    @property
    def stats(self) -> dict[str, int]:
        """Counts of all runs: ``completed``, ``failed`` (will retry), ``dead``, ``lost``
        and ``postponed``, as the class docstring defines them."""
        return self.loop.reporter.stats

    # -- control -------------------------------------------------------------
    def stop(self, force: bool = False) -> None:
        """Stop claiming; ``run()`` returns once the running jobs are reported
        (or ``shutdown_timeout`` s have passed). ``force``: return at once,
        leaving running jobs to their leases. Safe from any thread and from a
        signal handler."""
        self.loop.stop(force)

    def on_signal(self, signum: int, frame) -> None:
        """What SIGTERM / SIGINT do (``run`` installs it; ``runworker`` also
        routes a signal sent before ``run`` here): the first is ``stop()``,
        the next ``stop(force=True)``, each logged at WARNING.
        docs/explanation/reliability.md#stopping-a-worker"""
        name = signal.Signals(signum).name
        self.signalled = True
        if self.loop.stopping.is_set():
            log.warning(
                "%s again: stopping now; %d running jobs are left to their leases",
                name,
                len(self.loop.claims),
            )
            self.stop(force=True)
        else:
            stuck = self.loop.timeouts.stuck
            log.warning(
                "%s: no more claims; finishing %d running jobs%s (up to %.0fs); send it "
                "again to stop at once",
                name,
                len(self.loop.claims),
                f" and {stuck} handlers past their time limit" if stuck else "",
                self.shutdown_timeout,
            )
            self.stop()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {
            sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
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
        loop = self.loop
        loop.begin("echomq-worker")
        self._halt.clear()
        helpers = [
            threading.Thread(target=target, daemon=True, name=name)
            for target, name in (
                (self._heartbeat, "echomq-heartbeat"),
                (loop.reporter.run, "echomq-reporter"),
                (loop.writes.run, "echomq-writes"),
                (loop.timeouts.run, "echomq-timeouts"),
            )
        ]
        for thread in helpers:
            thread.start()
        if self._drainer is not None:
            self._drainer.drain_once()  # a burst run sees what waited at its start
            self._drainer.start(drain_now=False)
        start = self.processed
        log.info(
            "worker started: queues %s, concurrency %d (%s pool), lease %s ms",
            ", ".join(self.queues),
            self.concurrency,
            self.pool_kind,
            ", ".join(f"{q}={ms}" for q, ms in self.leases.items()),
        )
        beat = heartbeat.announce(
            self.mq,
            "worker",
            self.queues,
            register=self.register,
            beat_s=self.beat_s,
            status=self._status,
            concurrency=self.concurrency,
            warn=log,
            process_id=self.process_id,
        )
        try:
            loop.run(burst, max_jobs)
        finally:
            unreported = loop.end()
            if self._drainer is not None:
                self._drainer.stop()
            if beat is not None:
                beat.stop()
            self._halt.set()
            for thread in helpers:  # daemons: one stuck on a dead socket is left behind
                thread.join(timeout=0 if loop.reporter.unreported else 2.0)
            self.abandoned, running = unreported, min(loop.executing, unreported)
            stuck = self.left_running = loop.timeouts.stuck
            restore()
            loop.shut_pool(self.abandoned)
            if self.abandoned:
                log.warning(
                    "stopped with %d jobs unreported (%d still running, %d finished and not "
                    "reported: Redis did not answer); their leases will expire and they run "
                    "again (a worker's or the pump's timers recover them)",
                    *(self.abandoned, running, self.abandoned - running),
                )
            if stuck:
                log.warning(
                    "stopped with %d handlers past their time limit still running (their jobs "
                    "were failed as timed out); exiting now cuts them off",
                    stuck,
                )
            if loop.commands is not None:
                loop.commands.finish()
            log.info("worker stopped: processed %d jobs this run", self.processed - start)
        return self.processed - start

    def _status(self) -> dict:
        """What the heartbeat says: jobs done, and the jobs it runs now."""
        running = self.loop.claims.refs()
        return {
            "jobs_done": self.processed,
            "concurrency": self.loop.concurrency,
            "running": len(running),
            "running_jobs": [f"{q}/{i}" for q, i in running[: heartbeat.RUNNING_SHOWN]],
        }

    def _heartbeat(self) -> None:
        """Extend the lease of each held job (running, or finished and not reported yet) that
        has used a third of it: one round trip a beat (``EchoMQ.extend_leases``). A beat that
        meets an outage is tried again after 50 ms, the wait doubling back to the beat's."""
        wait = beat = self.heartbeat_s
        retry = first = min(0.05, beat)  # s: a refused beat's first retry
        while not self._halt.wait(wait):
            now, leases, wait = self.mq.clock(), self.leases, beat
            due = [job for job in self.loop.claims.jobs() if job.lease_deadline is not None
                   and job.lease_deadline - now <= leases[job.queue] * 2 // 3]  # fmt: skip
            try:
                replies = self.mq.extend_leases(due, leases) if due else ()
            except REDIS_DOWN:  # the loop reports the outage; a blip must not cost a beat
                wait, retry = retry, min(retry * 2, beat)
                continue
            except Exception:  # a bug: logged, and the next beat tries again
                log.exception("extending the leases of %d jobs failed", len(due))
                continue
            retry = first
            for job, reply in zip(due, replies, strict=True):
                if isinstance(reply, JobCancelled):
                    # docs/explanation/lifecycle.md#cancel: the handler may read job.cancelled
                    # and stop; its result will be dropped, and the lease is left to run out
                    job.cancelled, job.lease_deadline = True, None
                    log.info("job %s/%s (%s) was cancelled while it ran", job.queue, job.id,
                             job.name)  # fmt: skip
                elif isinstance(reply, GONE):  # or just reported: only reporting knows, and warns
                    job.lease_deadline = None
                    log.debug("job %s/%s: lease not extended: %s", job.queue, job.id, reply)
                elif isinstance(reply, Exception):
                    log.error("lease of job %s/%s not extended: %r", job.queue, job.id, reply)


def pool_maker(pool: str, mq, max_jobs_per_child=None, max_memory_per_child=None):
    """The ``make_pool(loop, name)`` a ``ClaimLoop`` takes for ``pool`` (one
    of ``POOLS``; None for ``"thread"``, its default ``HandlerPool``).
    Raises ``ValueError`` when the async pool cannot run here (aio.check)."""
    if pool == "process":
        return processes.maker(mq, max_jobs_per_child, max_memory_per_child)
    if pool == "async":
        aio.check()
        return aio.make
    return None


def _at_least(low: int, value, what: str, high: float = float("inf")) -> int:
    if isinstance(value, bool) or int(value) != value or not low <= value <= high:
        rule = f">= {low}" if high == float("inf") else f"from {low} to {high:,}"
        raise ValueError(f"{what} must be an integer {rule}, got {value!r}")
    return int(value)
