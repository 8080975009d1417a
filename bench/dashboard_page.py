"""The dashboard's server time (docs/howto/operate.md#the-dashboard): a
site of ``--queues`` queues, each with a few jobs added, finished and
dead, on a private redis-server; the median of ``--runs`` builds of the
page's context and its rendered body (what the JSON endpoint answers),
for the hour and the day. ``--busy`` fills every queue's ring with a
day of counts first (every minute counted: the most the chart reads).

    python -m bench.dashboard_page --queues 50 --runs 20 [--busy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import django
import redis


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queues", type=int, default=50)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--busy", action="store_true", help="a day of counts in every ring")
    args = p.parse_args(argv)
    from echomq_django.testing.redis_server import start_server

    server = start_server()
    try:
        # the test project's settings: its admin site and URLs (jobs_url)
        os.environ["ECHOMQ_URL"] = server.url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
        django.setup()
        from echomq_django import EchoMQ
        from echomq_django.admin.dashboard import RANGES, dashboard, dashboard_json

        mq = EchoMQ(redis.Redis.from_url(server.url), prefix="bd")
        names = [f"queue-{i:03d}" for i in range(args.queues)]
        for name in names:
            mq.enqueue_many(name, [("bench.noop", n) for n in range(10)])
            jobs = mq.claim(name, 4)
            for job in jobs[:3]:
                mq.complete(job, 1)
            mq.fail(jobs[3], "boom", dead=True)
        if args.busy:
            from echomq_django.protocol.probes import MINUTES_KEPT

            now = int(mq.client.time()[0]) // 60
            for name in names:  # the ring's layout: docs/explanation/protocol.md#minute-counters
                ring = {}
                for m in range(now - MINUTES_KEPT + 1, now + 1):
                    slot = m % MINUTES_KEPT
                    ring.update({f"m{slot}": m, f"a{slot}": 9, f"c{slot}": 7, f"f{slot}": 1})
                    ring[f"d{slot}"] = 1
                mq.client.hset(mq.keys.queue(name).minutes, mapping=ring)
        for range_name, minutes in RANGES.items():
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                dashboard_json(dashboard(mq, names, minutes))
                times.append((time.perf_counter() - started) * 1000)
            median = statistics.median(times)
            print(
                f"{args.queues} queues{' (busy rings)' if args.busy else ''}, "
                f"the {range_name}: median {median:.0f} ms, "
                f"best {min(times):.0f} ms, worst {max(times):.0f} ms over {args.runs} runs"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
