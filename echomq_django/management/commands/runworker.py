"""``./manage.py runworker QUEUE [QUEUE...]``: run handlers until stopped
(docs/explanation/house.md#runners-threads-and-loops).

Thin: parses options, sets up logging from ``--verbosity`` (``logs.py``), reaches
Redis (``runners.outage.reach_redis_at_start``: a worker started before Redis
waits for it; with ``--burst`` or ``--no-wait`` it exits 1 with a one-line
reason instead), then runs
``Worker(queues, ...).run(burst=..., max_jobs=...)``; with ``--pump`` also a
``Pump`` for the same queues on a thread of this process (a small site runs
one process, docs/explanation/no-polling.md). Exit status: 0 after a
clean stop (a SIGTERM while starting included); 1 when Redis is
unreachable at start with ``--burst`` or ``--no-wait``, or is not what the settings
say (a Cluster node without CLUSTER, a DB index out of range), the settings
or a flag are wrong (``--concurrency`` and ``--max-jobs`` >= 1, ``--lease-ms``
1 ms to 365 days, ``--pool`` thread, process or async,
``--max-jobs-per-child`` and ``--max-memory-per-child`` >= 1 and with
``--pool process`` only, ``--autoscale`` MAX,MIN with MAX >= MIN >= 1,
``--pump-interval`` and ``--no-mirror`` with ``--pump`` only; checked before
Redis is reached), or
the worker stopped with jobs unreported, still running (a second signal, or
``--shutdown-timeout`` passed) or finished while Redis did not answer: those
are left to their leases, and a worker's timers (or the pump) recover them.

Alone, ``runworker`` runs a site's queues but for periodic jobs: its timers
promote delayed jobs, recover expired leases at their deadline and fire
``children_timeout_ms``; ``ECHOMQ["SCHEDULE"]`` entries fire only under a pump,
so it logs one WARNING at start when some on its queues have no live pump
(docs/howto/operate.md#which-commands-a-site-runs).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand

from echomq_django.commit_outbox import Drainer, tables_missing
from echomq_django.conf.timing import check_flag_seconds
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.core.jobs import MAX_LEASE_MS
from echomq_django.core.keyspace import whole_number
from echomq_django.logs import setup_logging
from echomq_django.monitoring import metrics
from echomq_django.monitoring.mirror import mirror_after_sweep
from echomq_django.runners import periodic
from echomq_django.runners.control import autoscale
from echomq_django.runners.outage import StartSignals, reach_redis_at_start
from echomq_django.runners.pump import Pump
from echomq_django.runners.timers import SWEEP_S
from echomq_django.runners.wake import BLOCK_S
from echomq_django.runners.worker import POOLS, Worker

# what a pump sweep moved that a next burst may run (SweepReport's counts)
SWEEP_MOVES = ("delivered", "promoted", "recovered", "released", "scheduled")
PUMP_INTERVAL_S = 1.0  # --pump: seconds between the pump's sweeps when --pump-interval is not given


def pool_flags(opts) -> None:
    """Raise ``ValueError`` (one line, naming the flag and the rule) for a bad
    ``--pool``, ``--max-jobs-per-child``, ``--max-memory-per-child`` or
    ``--autoscale`` (parsed in place to ``(MAX, MIN)``), or a ``--pump-interval``
    or ``--no-mirror`` without ``--pump``."""
    if opts["pool"] not in POOLS:
        raise ValueError(f"--pool must be one of {', '.join(POOLS)}, got {opts['pool']!r}")
    for flag in ("--max-jobs-per-child", "--max-memory-per-child"):
        value = opts[flag[2:].replace("-", "_")]
        whole_number(flag, value, 1, optional=True)
        if value is not None and opts["pool"] != "process":
            raise ValueError(f"{flag} applies to --pool process only")
    if opts["autoscale"] is not None:
        opts["autoscale"] = autoscale.parse(opts["autoscale"])
    for flag, given in (("--pump-interval", opts["pump_interval"] is not None),
                        ("--no-mirror", opts["no_mirror"])):  # fmt: skip
        if given and not opts["pump"]:
            raise ValueError(f"{flag} applies with --pump only")


def time_flags(opts) -> None:
    """Raise ``ValueError`` (one line, naming the flag, the rule and the value) for
    a ``--shutdown-timeout`` below 0 s, or a ``--block-timeout``, ``--sweep-interval``
    or ``--pump-interval`` not above 0 s; any of them not finite (nan, inf)
    (docs/reference/commands.md#runworker); any of them over ``MAX_FLAG_S`` (a day)."""
    if not 0 <= opts["shutdown_timeout"] < math.inf:
        raise ValueError(
            f"--shutdown-timeout must be a finite number >= 0 s, got {opts['shutdown_timeout']:g}"
        )
    for flag in ("--block-timeout", "--sweep-interval", "--pump-interval"):
        value = opts[flag[2:].replace("-", "_")]
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"{flag} must be a finite number > 0 s, got {value:g}")
    for flag in ("--shutdown-timeout", "--block-timeout", "--sweep-interval", "--pump-interval"):
        check_flag_seconds(flag, opts[flag[2:].replace("-", "_")])


class Command(BaseCommand):
    help = (
        "Run the handlers of jobs claimed from QUEUE... on a pool of threads (or of "
        "processes, --pool process, or of coroutines on one event loop, --pool async) until "
        "SIGTERM/SIGINT (the first stops claiming and finishes running jobs, a second stops "
        "at once), or until the queues are empty with --burst. --verbosity: 0 warnings "
        "only, 1 a throughput line every 5 s, 2 a line per job, 3 debug."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="queue names to work on")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="handlers (threads, processes or coroutines): jobs run at once (>= 1; default 1)",
        )
        parser.add_argument(
            "--pool",
            default="thread",
            help="where handlers run: thread (handler threads, the default), process "
            "(pre-forked handler processes, killed past a job's time limit and replaced; "
            "docs/howto/process-pool.md) or async (async def handlers as coroutines on one "
            "event loop, cancelled past a job's time limit; "
            "docs/howto/async-handlers.md#the-async-pool)",
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=int,
            default=None,
            help="with --pool process: replace a handler process after this many jobs "
            "(count; default: no limit)",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=int,
            default=None,
            help="with --pool process: replace a handler process once its resident memory "
            "passes this many MiB after a job (default: no limit)",
        )
        parser.add_argument(
            "--autoscale",
            default=None,
            metavar="MAX,MIN",
            help="run between MIN and MAX handlers (threads, processes or coroutines): "
            "start with MIN, "
            "double while every handler is busy and jobs wait, halve after 9 s without "
            "(--concurrency is ignored)",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="exit once no job is pending or due and nothing is running: a full "
            "RATE_LIMIT window is waited out, a paused queue and delayed jobs not yet due "
            "are not (docs/howto/testing.md#runworker---burst-in-scripts-and-ci)",
        )
        parser.add_argument(
            "--max-jobs",
            type=int,
            default=None,
            help="exit after this many jobs (count; default: no limit)",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            help="seconds a graceful stop waits for running jobs (default 30)",
        )
        parser.add_argument(
            "--lease-ms",
            type=int,
            default=None,
            help="lease length in ms for every queue (default: each queue's "
            "LEASE_MS setting, 30000)",
        )
        parser.add_argument(
            "--block-timeout",
            "--poll-interval",  # its former name
            dest="block_timeout",
            type=float,
            default=BLOCK_S,
            help="longest single wait (s) on the queues' wake keys: an idle worker "
            f"blocks in Redis and starts a job as it lands (default {BLOCK_S:g})",
        )
        parser.add_argument(
            "--sweep-interval",
            type=float,
            default=SWEEP_S,
            help="seconds between sweeps of a queue (the safety net: lost wake-ups, "
            f"retention), done by one of its workers (default {SWEEP_S:g})",
        )
        parser.add_argument(
            "--max-stalls",
            type=int,
            default=1,
            help="lease expiries a job survives before it dies, when this worker's timers "
            "recover it (default 1; give runpump the same)",
        )
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="exit 1 at once when Redis does not answer at start (without it, and "
            "without --burst, the worker waits for Redis: tries after 0.5 s, 1 s, then "
            "every 2 s, a warning for each of the first three, then one every 30 s)",
        )
        parser.add_argument(
            "--pump",
            action="store_true",
            help="also run the pump for these queues in this process (as runpump: "
            "cross-queue delivery, sweeps, the admin mirror)",
        )
        parser.add_argument(
            "--pump-interval",
            type=float,
            default=None,
            help="with --pump: seconds between the pump's sweeps (default 1.0)",
        )
        parser.add_argument(
            "--no-mirror",
            action="store_true",
            help="with --pump: do not refresh the admin mirror after each sweep",
        )
        metrics.add_arguments(parser)

    def handle(self, *args, **opts):
        starting = StartSignals(logging.getLogger("echomq_django.worker"))
        try:
            return self._handle(starting, opts)
        finally:
            starting.close()

    def _handle(self, starting: StartSignals, opts: dict):
        setup_logging(opts["verbosity"])
        try:  # before Redis: a bad flag is the first thing said
            whole_number("--concurrency", opts["concurrency"], 1)
            whole_number("--lease-ms", opts["lease_ms"], 1, optional=True, high=MAX_LEASE_MS)
            whole_number("--max-jobs", opts["max_jobs"], 1, optional=True)
            whole_number("--max-stalls", opts["max_stalls"], 0)
            time_flags(opts)
            pool_flags(opts)
            metrics.check_arguments(opts)
        except ValueError as err:
            self._exit(f"runworker: {err}")
        wait = not (opts["burst"] or opts["no_wait"])
        try:
            mq = reach_redis_at_start(wait, starting.log, starting.stopped)
        except (ImproperlyConfigured, RedisUnavailable) as err:
            self._exit(f"runworker: {err}")
        except Exception as err:
            self._exit(f"runworker: Redis is unreachable: {err}")
        if mq is None:
            return  # a signal while starting
        missing = tables_missing()
        if missing:
            logging.getLogger("echomq_django.worker").warning(
                "runworker: %s; until then the commit outbox is not drained", missing
            )
        counters = None
        if opts["metrics_port"] is not None:
            counters = metrics.process_metrics()
            if counters is None:
                self._exit(f"runworker: {metrics.MISSING}")
        try:
            worker = Worker(
                opts["queues"],
                concurrency=opts["concurrency"],
                mq=mq,
                lease_ms=opts["lease_ms"],
                shutdown_timeout=opts["shutdown_timeout"],
                block_timeout=opts["block_timeout"],
                sweep_interval=opts["sweep_interval"],
                max_stalls=opts["max_stalls"],
                drainer=None if missing else Drainer(mq),
                metrics=counters,
                pool=opts["pool"],
                max_jobs_per_child=opts["max_jobs_per_child"],
                max_memory_per_child=opts["max_memory_per_child"],
                autoscale=opts["autoscale"],
            )
        except (ValueError, ImproperlyConfigured) as err:
            self._exit(f"runworker: {err}")
        problem = metrics.serve_for_command(opts, mq, worker.queues)
        if problem:
            self._exit(f"runworker: {problem}")
        if starting.hand_over(worker.on_signal):
            return
        if not opts["pump"]:
            self._warn_unfired_schedule(mq, worker.queues)
        if opts["burst"] and opts["pump"]:
            self._burst_with_pump(worker, mq, opts)
        else:
            stop_pump = self._start_pump(mq, opts) if opts["pump"] else None
            try:
                worker.run(burst=opts["burst"], max_jobs=opts["max_jobs"])
            finally:
                if stop_pump is not None:
                    stop_pump()
        if worker.abandoned:
            # Handler threads may still run and cannot be interrupted; leave now and
            # let the leases expire (a worker's or the pump's timers recover the jobs).
            self._exit(
                f"runworker: stopped with {worker.abandoned} jobs unreported (still running, "
                "or finished while Redis did not answer; the WARNING above counts each); "
                "their leases will expire and they run again",
                hard=True,
            )
        if worker.left_running:
            # written off past their time limit (their jobs failed already): their
            # threads would hold a normal exit for as long as they run
            self._exit(
                f"runworker: stopped with {worker.left_running} handlers past their time "
                "limit still running; exiting cuts them off",
                hard=True,
            )

    def _warn_unfired_schedule(self, mq, queues) -> None:
        """One WARNING when ``ECHOMQ["SCHEDULE"]`` has entries on these
        queues and no live pump serves them: periodic jobs fire only under a
        pump (docs/howto/periodic.md). Silent if it cannot tell."""
        try:
            unfired = periodic.without_a_pump(mq, queues)
        except Exception:  # a bad entry is check's to report; Redis away: the loop's
            return
        if unfired:
            names = ", ".join(f"{e.key} (queue {e.queue})" for e in unfired)
            where = " ".join(sorted({e.queue for e in unfired}))
            logging.getLogger("echomq_django.worker").warning(
                "runworker: periodic jobs %s fire only under a pump, and no live pump "
                "serves their queues: run `manage.py runpump %s` or `runworker --pump`",
                names,
                where,
            )

    def _burst_with_pump(self, worker, mq, opts) -> None:
        """``--burst --pump``: a burst, then one pump sweep, in turn, until a
        burst runs nothing and a sweep moves nothing (delivers, releases,
        promotes, recovers or schedules no job), so a cross-queue flow
        finishes in one command: the children's burst, the sweep that
        delivers their results and releases the parent, the parent's burst
        (docs/howto/testing.md#runworker---burst-in-scripts-and-ci). A
        signal, an abandoned handler or ``--max-jobs`` spent ends it too.
        Each burst logs its own start and stop lines; the last line is the
        whole command's: "burst with pump done: processed N jobs in B
        bursts; S sweeps moved M". Exits 1 when Redis stops answering
        between two bursts."""
        hooks = [] if opts["no_mirror"] else [mirror_after_sweep]
        pump = Pump(opts["queues"], mq=mq, after_sweep=hooks)
        left = opts["max_jobs"]
        done = [0, 0, 0, 0]  # jobs, bursts, sweeps, what the sweeps moved
        try:
            while True:
                ran = worker.run(burst=True, max_jobs=left)
                done[0], done[1] = done[0] + ran, done[1] + 1
                if worker.signalled or worker.abandoned or worker.left_running:
                    return
                if left is not None:
                    left -= ran
                    if left <= 0:
                        return
                try:
                    reports = pump.sweep()
                except RedisUnavailable as err:
                    self._exit(f"runworker: {err}")
                moved = sum(r[k] for r in reports.values() for k in SWEEP_MOVES)
                done[2], done[3] = done[2] + 1, done[3] + moved
                if not ran and not moved:
                    return
        finally:  # the last burst alone ran nothing: the command's totals say what all did
            logging.getLogger("echomq_django.worker").info(
                "burst with pump done: processed %d jobs in %d bursts; %d sweeps moved %d", *done
            )

    def _start_pump(self, mq, opts):
        """Run ``Pump.run`` for the worker's queues on a daemon thread;
        returns the function that stops it."""
        hooks = [] if opts["no_mirror"] else [mirror_after_sweep]
        pump = Pump(opts["queues"], mq=mq, after_sweep=hooks)
        thread = threading.Thread(
            target=pump.run,
            kwargs={"interval": opts["pump_interval"] or PUMP_INTERVAL_S},
            daemon=True,
            name="echomq-pump",
        )
        thread.start()

        def stop() -> None:
            pump.stop()
            thread.join(timeout=5)

        return stop

    def _exit(self, reason: str, hard: bool = False) -> None:
        self.stderr.write(" ".join(reason.split()))
        self.stderr.flush()
        if hard:
            logging.shutdown()
            os._exit(1)
        sys.exit(1)
