"""``./manage.py runpump QUEUE...``: sweep queues until stopped
(docs/explanation/protocol.md#the-flow-outbox-and-the-pump).

Thin: parses options, sets up logging from ``--verbosity`` (``logs.py``),
runs ``Pump(queues).run(...)``. A pump started before Redis waits for it
(``runners.outage.reach_redis_at_start``). Exit 1 with a one-line reason when
Redis is unreachable at start with ``--once`` or ``--no-wait``, is not what
the settings say (a Cluster node without
CLUSTER, a DB index out of range), or a flag breaks its rule (``--interval``
and ``--summary-every`` > 0 s, ``--batch`` / ``--max-tries`` >= 1, ``--lock-ms``
>= 100 ms, ``--max-stalls`` >= 0: ``check_flags``, before Redis is reached);
later drops are waited out by ``Pump.run``.
"""

from __future__ import annotations

import logging
import math
import signal
import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from echomq_django.commit_outbox import drain_after_sweep, tables_missing
from echomq_django.conf.timing import MAX_FLAG_S, check_flag_seconds
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.core.keyspace import whole_number
from echomq_django.logs import setup_logging
from echomq_django.monitoring import metrics
from echomq_django.monitoring.mirror import mirror_after_sweep
from echomq_django.runners.outage import StartSignals, reach_redis_at_start
from echomq_django.runners.pump import LOCK_MS, LOCK_MS_MIN, Pump, check_interval

log = logging.getLogger("echomq_django.pump")


def check_flags(opts: dict) -> None:
    """Raise ``ValueError`` (one line, naming the flag, the rule and the value) for a
    ``--batch`` or ``--max-tries`` below 1, a ``--lock-ms`` below ``LOCK_MS_MIN`` or over a
    day, a
    ``--max-stalls`` below 0, or an ``--interval`` (but with ``--once``) or
    ``--summary-every`` not a finite number above 0 s and at most a day
    (docs/reference/commands.md#runpump)."""
    whole_number("--batch", opts["batch"], 1)
    whole_number("--lock-ms", opts["lock_ms"], LOCK_MS_MIN, high=int(MAX_FLAG_S * 1000))
    whole_number("--max-tries", opts["max_tries"], 1)
    whole_number("--max-stalls", opts["max_stalls"], 0)
    for flag in ("--interval", "--summary-every"):
        value = opts[flag[2:].replace("-", "_")]
        if not 0 < value < math.inf and not (flag == "--interval" and opts["once"]):
            raise ValueError(f"{flag} must be a finite number > 0 s, got {value:g}")
        check_flag_seconds(flag, value)


class Command(BaseCommand):
    help = (
        "Sweep queues: deliver each queue's outbox (cross-queue fan-in), promote due "
        "delayed jobs, recover expired leases, push the commit outbox, refresh the admin "
        "mirror. Runs until "
        "SIGTERM/SIGINT (graceful: the current sweep finishes), or once with --once."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="queue names to sweep")
        parser.add_argument(
            "--interval",
            type=float,
            default=1.0,
            help="seconds between sweeps when idle (> 0, at most 86400; default 1.0)",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=500,
            help="outbox entries delivered per round trip (>= 1; default 500)",
        )
        parser.add_argument("--once", action="store_true", help="sweep once and exit")
        parser.add_argument(
            "--lock-ms",
            type=int,
            default=LOCK_MS,
            help=f"ms a sweep's lock on a queue's outbox lasts unless renewed; renewed after "
            f"every batch, so a peer takes over this long after a pump died mid-sweep "
            f"(default {LOCK_MS}, at least {LOCK_MS_MIN})",
        )
        parser.add_argument(
            "--max-tries",
            type=int,
            default=3,
            help="deliveries of an entry whose parent is gone before it is "
            "dead-lettered (>= 1; default 3)",
        )
        parser.add_argument(
            "--max-stalls",
            type=int,
            default=1,
            help="lease expiries a job survives before it dies (default 1)",
        )
        parser.add_argument(
            "--summary-every",
            type=float,
            default=10.0,
            help="seconds between summary lines at verbosity >= 1 (default 10)",
        )
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="exit 1 at once when Redis does not answer at start (without it, and "
            "without --once, the pump waits for Redis: tries after 0.5 s, 1 s, then "
            "every 2 s, a warning for each of the first three, then one every 30 s)",
        )
        parser.add_argument(
            "--no-mirror",
            action="store_true",
            help="do not refresh the admin mirror after each sweep",
        )
        metrics.add_arguments(parser)

    def handle(self, *args, **opts):
        starting = StartSignals(log)
        try:
            return self._handle(starting, opts)
        finally:
            starting.close()

    def _handle(self, starting: StartSignals, opts: dict):
        setup_logging(opts["verbosity"], runner="echomq_django.pump")
        try:  # before Redis: a bad flag is the first thing said
            check_flags(opts)
            metrics.check_arguments(opts)
        except ValueError as err:
            raise CommandError(f"runpump: {err}", returncode=1) from None
        try:
            wait = not (opts["once"] or opts["no_wait"])
            mq = reach_redis_at_start(wait, log, starting.stopped)
        except (ImproperlyConfigured, RedisUnavailable) as err:
            raise CommandError(f"runpump: {err}", returncode=1) from None
        if mq is None:
            return  # a signal while starting
        hooks = [drain_after_sweep] + ([] if opts["no_mirror"] else [mirror_after_sweep])
        missing = tables_missing()
        if missing:
            log.warning(
                "runpump: %s; until then the commit outbox is not drained and the admin "
                "mirror is off",
                missing,
            )
            hooks = []
        try:
            if not opts["once"]:
                check_interval(opts["interval"])
            pump = Pump(
                opts["queues"],
                mq=mq,
                batch=opts["batch"],
                lock_ms=opts["lock_ms"],
                max_tries=opts["max_tries"],
                max_stalls=opts["max_stalls"],
                after_sweep=hooks,
            )
        except ValueError as err:
            raise CommandError(f"runpump: {err}", returncode=1) from None
        problem = metrics.serve_for_command(opts, mq, pump.queues)
        if problem:
            raise CommandError(f"runpump: {problem}", returncode=1)
        stop = threading.Event()

        def on_signal(signum, frame):
            log.warning(
                "runpump: %s received, stopping after this sweep", signal.Signals(signum).name
            )
            stop.set()

        if starting.hand_over(on_signal):
            return
        pump.run(
            interval=opts["interval"],
            once=opts["once"],
            should_stop=stop.is_set,
            summary_every=opts["summary_every"],
        )
