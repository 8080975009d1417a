"""``python -m bench.claims``: what priorities and a rate limit cost at claim
(the target: at most 15% of plain-job throughput), and how late a
periodic job fires after its tick (target: within 50 ms).

Throughput: on a private redis-server, N plain jobs are claimed and completed
in batches of ``--batch`` by one ``EchoMQ`` (the worker's two round trips per
batch, without threads), then the same N jobs with priorities 0-9 on a queue
with a ``RATE_LIMIT`` wide enough never to stop it (so every claim runs the
limiter and the prioritized zset). The two runs alternate ``--repeat`` times
(A B A B ...) and the medians and the ratio are printed.

Firing delay: a ``Scheduler`` with an ``every_s=1`` entry, driven the way a
pump drives it (sleep ``wait_s``, then ``fire_due``), fires ``--ticks`` ticks;
for each, the delay from the tick to the job's row existing (its
``created_at``) is printed, with the median and the maximum.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from echomq_django import EchoMQ
from echomq_django.core.rows import CREATED
from echomq_django.runners.periodic import Entry, Scheduler
from echomq_django.testing.redis_server import start_server

LIMIT = {"RATE_LIMIT": {"MAX": 10**9, "PER_MS": 1000}}


def fill(mq: EchoMQ, queue: str, n: int, prioritized: bool) -> None:
    for i in range(n):
        mq.enqueue(queue, "bench.noop", {"i": i}, priority=(i % 10) if prioritized else 0)


def drain(mq: EchoMQ, queue: str, batch: int) -> int:
    done = 0
    while jobs := mq.claim(queue, batch):
        mq.complete_many([(job, None) for job in jobs])
        done += len(jobs)
    return done


def redis_cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def throughput(client, n: int, batch: int, prioritized: bool) -> tuple[float, float]:
    """(jobs per second, CPU µs per job: this process's and Redis's) through
    claim + complete; the queue filled beforehand. CPU time moves less than
    wall time on a shared machine."""
    client.flushall()
    queue = "limited" if prioritized else "plain"
    mq = EchoMQ(client, queues={"limited": LIMIT} if prioritized else {})
    fill(mq, queue, n, prioritized)
    start, cpu, rcpu = time.perf_counter(), time.process_time(), redis_cpu(client)
    done = drain(mq, queue, batch)
    elapsed = time.perf_counter() - start
    used = (time.process_time() - cpu) + (redis_cpu(client) - rcpu)
    assert done == n, (done, n)
    return n / elapsed, used / n * 1e6


def firing_delays(client, ticks: int) -> list[float]:
    client.flushall()
    mq = EchoMQ(client)
    scheduler = Scheduler(mq, [Entry(key="beat", name="bench.noop", queue="s", every_s=1)])
    scheduler.fire_due()  # the first start sets the mark
    delays = []
    while len(delays) < ticks:
        time.sleep(scheduler.wait_s(5.0))
        for queue, job_id in scheduler.fire_due():
            tick = int(job_id.rsplit("-", 1)[1])
            created = int(client.hget(mq.keys.job(queue, job_id), CREATED))
            delays.append(created - tick)
    return delays


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.claims", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=20000, help="jobs per run (default %(default)s)")
    p.add_argument("--batch", type=int, default=50, help="claim batch (default %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="A/B pairs (default %(default)s)")
    p.add_argument("--ticks", type=int, default=10, help="periodic ticks (default %(default)s)")
    p.add_argument("--redis-url", help="use this Redis (FLUSHALLed!) instead of a private one")
    args = p.parse_args(argv)
    server = None if args.redis_url else start_server()
    client = redis.Redis.from_url(args.redis_url or server.url)
    try:
        throughput(client, 2000, args.batch, False)  # warm-up: scripts loaded
        throughput(client, 2000, args.batch, True)
        plain, limited = [], []
        for _ in range(args.repeat):
            plain.append(throughput(client, args.jobs, args.batch, False))
            limited.append(throughput(client, args.jobs, args.batch, True))
        print(f"claim+complete, {args.jobs} jobs, batch {args.batch}, {args.repeat} pairs:")
        for label, runs in (("plain jobs", plain), ("priorities 0-9 + RATE_LIMIT", limited)):
            rate = statistics.median(r for r, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            print(f"  {label:<28}{rate:>9,.0f} jobs/s, {cpu:6.1f} CPU µs/job (medians)")
        for what, i in (("throughput", 0), ("CPU per job", 1)):
            ratios = [b[i] / a[i] for a, b in zip(plain, limited, strict=True)]
            mid = statistics.median(ratios)
            cost = 1 - mid if i == 0 else mid - 1
            print(
                f"  {what} ratio (limited / plain): {mid:.3f} median, "
                f"{min(ratios):.3f}-{max(ratios):.3f} (cost {cost:.1%})"
            )
        if args.ticks:
            delays = firing_delays(client, args.ticks)
            print(
                f"periodic job, every_s=1, {len(delays)} ticks: delay after the tick "
                f"median {statistics.median(delays):.0f} ms, max {max(delays)} ms"
            )
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
