"""``./manage.py runworker QUEUE [QUEUE...]``: run handlers until stopped
(DESIGN §8; issue "Workers").

Thin: parses options, sets up logging from ``--verbosity`` (``logs.py``), pings Redis once
(exit 1 with a one-line reason when it is unreachable), then runs
``Worker(queues, ...).run(burst=..., max_jobs=...)``. Exit status: 0 after a
clean stop; 1 when Redis is unreachable at start, the settings are wrong, or
the worker stopped with jobs still running (a second signal, or
``--shutdown-timeout`` passed): those are left to their leases, and the pump
recovers them.
"""

from __future__ import annotations

import logging
import os
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand

from echomq_django import metrics
from echomq_django.conf import get_mq
from echomq_django.exceptions import RedisUnavailable
from echomq_django.logs import setup_logging
from echomq_django.outbox import tables_missing
from echomq_django.worker import Worker


class Command(BaseCommand):
    help = (
        "Run the handlers of jobs claimed from QUEUE... on a pool of threads until "
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
            help="handler threads: jobs run at once (default 1)",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="exit once the queues are empty and nothing is running "
            "(delayed jobs are not waited for)",
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
            "--poll-interval",
            type=float,
            default=0.2,
            help="seconds an empty queue rests before it is asked again (default 0.2)",
        )
        metrics.add_arguments(parser)

    def handle(self, *args, **opts):
        setup_logging(opts["verbosity"])
        try:
            mq = get_mq()
        except ImproperlyConfigured as err:
            self._exit(f"runworker: {err}")
        except Exception as err:
            self._exit(f"runworker: Redis is unreachable: {err}")
        try:
            mq.ping()
        except RedisUnavailable as err:
            self._exit(f"runworker: {err}")
        missing = tables_missing()
        if missing:
            logging.getLogger("echomq_django.worker").warning(
                "runworker: %s; until then the enqueue outbox is not drained", missing
            )
        try:
            worker = Worker(
                opts["queues"],
                concurrency=opts["concurrency"],
                mq=mq,
                lease_ms=opts["lease_ms"],
                shutdown_timeout=opts["shutdown_timeout"],
                poll_interval=opts["poll_interval"],
                drain_outbox=not missing,
                metrics=opts["metrics_port"] is not None,
            )
        except (ValueError, ImproperlyConfigured) as err:
            self._exit(f"runworker: {err}")
        problem = metrics.serve_for_command(opts, mq, worker.queues)
        if problem:
            self._exit(f"runworker: {problem}")
        worker.run(burst=opts["burst"], max_jobs=opts["max_jobs"])
        if worker.abandoned:
            # Handler threads still run and cannot be interrupted; leave now and
            # let their leases expire (the pump recovers the jobs).
            self._exit(
                f"runworker: stopped with {worker.abandoned} jobs still running; "
                "their leases will expire and the pump recovers them",
                hard=True,
            )

    def _exit(self, reason: str, hard: bool = False) -> None:
        self.stderr.write(" ".join(reason.split()))
        self.stderr.flush()
        if hard:
            logging.shutdown()
            os._exit(1)
        sys.exit(1)
