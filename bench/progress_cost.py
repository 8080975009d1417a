"""``python -m bench.progress_cost``: what progress and job log writes cost
a plain drain (the target: at most 10% of its rate when every job writes
one of each; docs/explanation/protocol.md#progress-and-log-lines).

One private redis-server; in this process a burst ``Worker`` drains ``N``
plain jobs added before the clock starts. "plain" runs a handler that
returns at once; "reporting" one that first calls
``job.report_progress(50)`` and ``job.log("half way")``. Rounds alternate
plain / reporting; the medians of jobs per second are printed, with the
cost as a share of the plain rate, each kind's Redis time per job
(SLOWLOG, which the machine's noise does not reach), and the round trips
the worker's flusher made per job (the reporter's flush rides its batch).
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from echomq_django.testing.redis_server import start_server

from .soak import setup_django

Q = "plain"
PLAIN, REPORTING = "bench.plain", "bench.reporting"


def _handlers() -> None:
    from echomq_django import handler

    @handler(PLAIN)
    def plain(job):
        return 1

    @handler(REPORTING)
    def reporting(job):
        job.report_progress(50)
        job.log("half way")
        return 1


def _redis_us_per_job(client, n: int) -> float:
    """Redis' own time (us) of every EVALSHA since the last SLOWLOG RESET, per job."""
    total = sum(
        e["duration"]
        for e in client.slowlog_get(-1)
        if e["command"].split()[:1] in ([b"EVALSHA"], [b"EVAL"])
    )
    return total / n


def drain(mq, client, name: str, n: int, concurrency: int) -> tuple[float, float, float]:
    """Add ``n`` jobs named ``name``, then drain them with a burst worker;
    returns (jobs per second, Redis us per job, round trips of progress and
    log writes per job)."""
    from echomq_django import Worker

    client.flushall()
    mq.enqueue_many(Q, [(name, {"i": i}) for i in range(n)])
    client.slowlog_reset()
    worker = Worker([Q], mq=mq, concurrency=concurrency, register=False)
    started = time.perf_counter()
    done = worker.run(burst=True)
    elapsed = time.perf_counter() - started
    assert done == n, (done, n)
    return n / elapsed, _redis_us_per_job(client, n), worker.loop.writes.stats["sends"] / n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000, help="jobs per drain (default %(default)s)")
    p.add_argument(
        "--rounds", type=int, default=3, help="drains of each kind (default %(default)s)"
    )
    p.add_argument("--concurrency", type=int, default=8, help="handler threads (default 8)")
    args = p.parse_args(argv)
    server = start_server()
    try:
        setup_django(server.url, ":memory:")
        _handlers()
        from echomq_django import EchoMQ

        client = redis.Redis.from_url(server.url)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 4 * args.jobs)
        mq = EchoMQ(client, prefix="emq")
        drain(mq, client, PLAIN, 200, args.concurrency)  # warm: scripts loaded
        drain(mq, client, REPORTING, 200, args.concurrency)
        rates: dict[str, list] = {PLAIN: [], REPORTING: []}
        for _ in range(args.rounds):
            for name in (PLAIN, REPORTING):
                rates[name].append(drain(mq, client, name, args.jobs, args.concurrency))
        plain = statistics.median(r for r, _, _ in rates[PLAIN])
        reporting = statistics.median(r for r, _, _ in rates[REPORTING])
        for name in (PLAIN, REPORTING):
            rate = statistics.median(r for r, _, _ in rates[name])
            us = statistics.median(u for _, u, _ in rates[name])
            trips = statistics.median(t for _, _, t in rates[name])
            print(
                f"{name:16} {rate:8.0f} jobs/s   Redis {us:6.1f} us/job   "
                f"{trips:5.3f} round trips of writes/job"
            )
        print(f"cost of one progress + one log write per job: {100 * (1 - reporting / plain):.1f}%")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
