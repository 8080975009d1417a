"""``./manage.py echomq_stats [QUEUE...] [--json] [--watch S]``: per queue the
counts by state, the oldest pending job's age, jobs/s over the last minute,
outbox depth, dead-letters and paused or not; then the live workers and
pumps (docs/explanation/house.md#monitoring). No queue names: every known queue (``P:queues``,
``ECHOMQ["QUEUES"]`` and the queues live processes serve).

Exit 1 with a one-line reason for an unknown or invalid queue name or an
unreachable Redis.
"""

from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError

from echomq_django.conf import get_mq
from echomq_django.conf.timing import check_flag_seconds
from echomq_django.core.exceptions import EchoMQError
from echomq_django.monitoring.stats import collect, render


class Command(BaseCommand):
    help = (
        "Show each queue's counts by state, oldest pending age, jobs/s over the last "
        "minute, outbox depth, dead-letters and pause state, and the live workers and "
        "pumps. --json prints the stable 'echomq.stats/1' document (see docs/reference/stats.md)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "queues", nargs="*", metavar="QUEUE", help="queues to show (default: every known queue)"
        )
        parser.add_argument(
            "--json", action="store_true", help="print the JSON document instead of the table"
        )
        parser.add_argument(
            "--watch",
            type=float,
            metavar="S",
            help="refresh every S seconds (> 0) until Ctrl-C; with --json, one document per line",
        )
        parser.add_argument(
            "--count",
            type=int,
            metavar="N",
            help="with --watch: stop after N refreshes (>= 1)",
        )

    def handle(self, *args, **opts):
        watch, count = opts["watch"], opts["count"]
        if watch is not None and not watch > 0:
            raise CommandError(f"echomq_stats: --watch must be > 0 seconds, got {watch}")
        try:
            check_flag_seconds("--watch", watch)
        except ValueError as err:
            raise CommandError(f"echomq_stats: {err}") from None
        if count is not None and count < 1:
            raise CommandError(f"echomq_stats: --count must be >= 1, got {count}")
        if count is not None and watch is None:  # one report: a count would say nothing
            raise CommandError(
                "echomq_stats: --count counts the refreshes of --watch: give --watch S"
            )
        mq = get_mq()
        shown = 0
        try:
            while True:
                doc = self.read(mq, opts["queues"])
                if opts["json"]:
                    self.stdout.write(json.dumps(doc, indent=None if watch else 2))
                else:
                    if watch:
                        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["at"] / 1000))
                        self.stdout.write(f"== {stamp} (every {watch:g} s; Ctrl-C stops)")
                    self.stdout.write(render(doc))
                shown += 1
                if watch is None or (count is not None and shown >= count):
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return

    def read(self, mq, queues) -> dict:
        try:
            return collect(mq, queues)
        except (EchoMQError, ValueError) as err:  # RedisUnavailable says where it tried
            raise CommandError(f"echomq_stats: {err}") from None
