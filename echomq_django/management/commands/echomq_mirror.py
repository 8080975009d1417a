"""``./manage.py echomq_mirror [QUEUE...] [--full]``: refresh the admin mirror
now (docs/explanation/house.md#monitoring). No queue names: every known queue (``P:queues``, every
queue that ever had a job; ``ECHOMQ["QUEUES"]``; live workers' and pumps' queues)
plus the ones already mirrored; a queue named must be one of those. Exit 1
with a one-line reason for a bad or unknown queue name (nothing is
mirrored then) or when Redis is unreachable.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from echomq_django.conf import get_mq
from echomq_django.core.exceptions import EchoMQError
from echomq_django.monitoring.mirror import mirror_queues, mirror_targets
from echomq_django.monitoring.stats import resolve_queues


class Command(BaseCommand):
    help = (
        "Copy queues, jobs and flows from Redis into the admin's mirror tables, "
        "incrementally from each queue's event stream (or in full with --full)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "queues",
            nargs="*",
            metavar="QUEUE",
            help="queues to mirror, each a known queue or one already mirrored (default: "
            "every known queue and those already mirrored)",
        )
        parser.add_argument(
            "--full",
            action="store_true",
            help="rescan every state index and mark jobs gone from Redis",
        )

    def handle(self, *args, **opts):
        mq = get_mq()
        try:
            # a mistyped name would stay mirrored (empty) for good: only known queues
            queues = resolve_queues(mq, opts["queues"], known=mirror_targets(mq))
            reports = mirror_queues(mq, queues, full=opts["full"])
        except ValueError as err:
            raise CommandError(f"echomq_mirror: {err}", returncode=1) from None
        except EchoMQError as err:  # RedisUnavailable says where it tried
            raise CommandError(f"echomq_mirror: {err}", returncode=1) from None
        for queue, rep in reports.items():
            if opts["verbosity"] >= 1:
                how = "full rescan" if rep["full"] else f"{rep['events']} events"
                self.stdout.write(
                    f"{queue}: {how}, {rep['jobs']} jobs mirrored, {rep['gone']} marked gone"
                )
