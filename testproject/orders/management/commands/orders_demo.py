"""``./manage.py orders_demo``: post orders, watch their flows, check every
outcome (the README's demo). Thin: parses options and runs ``demo_run.Demo``.
``scripts/demo.sh`` sets up the machine first and then runs this."""

from __future__ import annotations

import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from testproject.orders.demo_data import CsvError, generate, read_csv
from testproject.orders.demo_run import Demo


class Command(BaseCommand):
    help = (
        "Run the orders pipeline end to end: migrate, start a private redis-server (unless "
        "ECHOMQ_URL is set), the web server, runworker and runpump, post orders through "
        "HTTP, show a progress bar while their flows resolve, and print a summary. Exits 1 "
        "if any order ends in a state its data does not predict, a post is refused, or the "
        "flows do not finish within --timeout; 130 on Ctrl-C. Every process it started "
        "is stopped on the way out."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--orders",
            type=int,
            default=200,
            help="how many generated orders to post (count; default 200)",
        )
        parser.add_argument(
            "--seed",
            type=int,
            default=7,
            help="seed of the generated mix (default 7: the same orders every run)",
        )
        parser.add_argument(
            "--from-csv",
            metavar="FILE",
            help="post the orders of this CSV instead (columns customer, email, "
            "card, lines, via; see testproject/orders/sample_orders.csv)",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="after the summary, leave the web server, worker, pump and "
            "Redis running until Ctrl-C (to browse the admin)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="seconds the flows may take once posted (default: 60 + 0.5 per order)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=8, help="runworker's handler threads (default 8)"
        )
        parser.add_argument(
            "--crash-after",
            type=int,
            default=0,
            metavar="N",
            help="a crash test: once N orders have finished, SIGKILL runworker and runpump "
            "and start them again (leases are 2 s long then, so the killed worker's jobs "
            "come back quickly); every order must still end in its predicted state, and "
            "its retries may exceed the prediction (an attempt the kill cut short counts)",
        )
        parser.add_argument(
            "--log-dir",
            default=str(Path(settings.BASE_DIR) / ".run" / "demo"),
            help="where the processes' logs go (default .run/demo)",
        )

    def handle(self, *args, **opts):
        if opts["from_csv"]:
            try:
                bodies = [(f"row {n}", body) for n, body in read_csv(opts["from_csv"])]
            except CsvError as err:
                raise CommandError(str(err)) from None
        else:
            if opts["orders"] < 1:
                raise CommandError("--orders must be at least 1")
            bodies = [
                (f"order {i + 1}", body)
                for i, body in enumerate(generate(opts["orders"], opts["seed"]))
            ]
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if not 0 <= opts["crash_after"] < len(bodies):
            raise CommandError(f"--crash-after must be from 1 to {len(bodies) - 1} (0: no crash)")
        timeout = opts["timeout"] if opts["timeout"] else 60 + 0.5 * len(bodies)
        demo = Demo(
            bodies,
            keep=opts["keep"],
            timeout=timeout,
            log_dir=Path(opts["log_dir"]),
            concurrency=opts["concurrency"],
            crash_after=opts["crash_after"],
            out=sys.stdout,
        )
        sys.exit(demo.run())
