"""``python -m bench.progress_cost``: what progress and job log writes cost
a plain drain (the target: at most 10% of its rate when every job writes
one of each; docs/explanation/protocol.md#progress-and-log-lines).

One private redis-server; in this process a burst ``Worker`` drains ``N``
plain jobs added before the clock starts. "plain" runs a handler that
returns at once; "reporting" one that first calls
``job.report_progress(50)`` and ``job.log("half way")``; each drain starts
after a full garbage collection (``gc.collect``), so one the previous
drain made due does not land in whichever round comes next. Rounds alternate
plain / reporting; the medians of jobs per second are printed, with the
cost as a share of the plain rate (the medians', with a 90% interval drawn
by resampling the rounds, and each round's), the
same for the CPU a job costs (this process and the server: the figure the
machine's load moves least), each kind's Redis time per job
in its scripts (``INFO commandstats``; an earlier SLOWLOG measure logged
every command inside the scripts too, which cost the server CPU of its own
and overflowed the log, so it counted part of a drain only), and the round trips
the worker's flusher made per job (the reporter's flush rides its batch).
``--pin`` puts this process on one CPU and the server on another.
``--write-path`` measures the writes alone on one thread instead
(``write_path``): the CPU a job's two writes cost this process and the
server, which the machine's load moves far less than a drain;
``--complete-path`` the completions, with and without those writes riding
them (``complete_path``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
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


def _script_us(client) -> float:
    """Redis' own time (us) in EVALSHA and EVAL so far (``INFO
    commandstats``: the scripts' commands included, no logging on the way)."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval"))


def _redis_cpu_s(client) -> float:
    """The server's CPU time so far (s, user + system)."""
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def drain(mq, client, name: str, n: int, concurrency: int) -> dict[str, float]:
    """Add ``n`` jobs named ``name``, then drain them with a burst worker;
    returns ``rate`` (jobs per second), ``redis_us`` (Redis' script time
    per job, us), ``cpu_us`` (this process's CPU plus the server's, per
    job, us: what the drain costs the machine, which the other processes'
    load moves far less than the rate) and ``trips`` (the flusher's round
    trips per job)."""
    from echomq_django import Worker

    client.flushall()
    # a full collection now, off the clock: one the last drain's garbage made due
    # (about 26 ms, 5 us a job of a 5,000-job drain) lands in neither kind's round
    gc.collect()
    mq.enqueue_many(Q, [(name, {"i": i}) for i in range(n)])
    script_us = _script_us(client)
    worker = Worker([Q], mq=mq, concurrency=concurrency, register=False)
    cpu, redis_cpu = time.process_time(), _redis_cpu_s(client)
    started = time.perf_counter()
    done = worker.run(burst=True)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu + _redis_cpu_s(client) - redis_cpu
    assert done == n, (done, n)
    writes = getattr(worker.loop, "writes", None)  # none before the flusher
    return {
        "rate": n / elapsed,
        "redis_us": (_script_us(client) - script_us) / n,
        "cpu_us": cpu / n * 1e6,
        "trips": writes.stats["sends"] / n if writes is not None else float("nan"),
    }


def _fresh_claimed(mq, client, n: int) -> list:
    """On a flushed server, ``n`` reporting jobs enqueued and claimed (a
    10-minute lease: no round outlives it)."""
    client.flushall()
    mq.enqueue_many(Q, [(REPORTING, {"i": i}) for i in range(n)])
    jobs = []
    while len(jobs) < n:
        jobs += mq.claim(Q, min(500, n - len(jobs)), lease_ms=600_000)
    return jobs


def write_path(mq, client, n: int, rounds: int) -> list[dict[str, float]]:
    """The writes alone, on one thread: ``n`` claimed jobs each call
    ``report_progress(50)`` and ``log("half way")`` into a worker's
    ``Flusher`` (no thread of its own), which then sends them all
    (``flush``), ``rounds`` times. Returns per round ``host_us`` (this
    process's CPU per job, us: the two calls, gathering, packing, the send
    and the replies) and ``server_us`` (the server's CPU per job, us): the
    CPU a job's two writes cost, with no other thread or drain to share
    the cores with, so the machine's load moves it little."""
    from echomq_django.runners.flusher import Flusher

    jobs = _fresh_claimed(mq, client, n)
    writes = Flusher(mq)
    for job in jobs:
        job._writes = writes
    out = []
    for _ in range(rounds):
        cpu, server = time.process_time(), _redis_cpu_s(client)
        for job in jobs:
            job.report_progress(50)
            job.log("half way")
        writes.flush()
        cpu, server = time.process_time() - cpu, _redis_cpu_s(client) - server
        assert writes.stats["dropped"] == 0, writes.stats
        out.append({"host_us": cpu / n * 1e6, "server_us": server / n * 1e6})
    return out


def complete_path(mq, client, n: int, rounds: int, batch: int = 8) -> list[dict[str, float]]:
    """The completions alone, on one thread, as the worker's reporter sends
    them: ``n`` claimed jobs completed in batches of ``batch`` (one
    ``complete_many`` round trip each), with the flusher's pending writes
    riding each batch (``Flusher.riding``); in each of ``rounds`` rounds
    first jobs that wrote nothing ("plain"), then jobs that each called
    ``report_progress(50)`` and ``log("half way")`` first ("reporting").
    Returns per round ``plain`` and ``reporting``: each a pair (this
    process's CPU per job, the server's, us), the writes' calls included."""
    from echomq_django.runners.flusher import Flusher

    out = []
    for _ in range(rounds):
        row = {}
        for kind in ("plain", "reporting"):
            jobs = _fresh_claimed(mq, client, n)
            writes = Flusher(mq)
            cpu, server = time.process_time(), _redis_cpu_s(client)
            for at in range(0, n, batch):
                part = jobs[at : at + batch]
                for job in part if kind == "reporting" else ():
                    job._writes = writes
                    job.report_progress(50)
                    job.log("half way")
                with writes.riding(part) as ride:
                    replies = mq.complete_many([(j, 1) for j in part], ride.ahead, ride.carry)
                    ride.settle(part, replies)
            cpu, server = time.process_time() - cpu, _redis_cpu_s(client) - server
            assert writes.stats["dropped"] == 0 and writes.pending() == 0, writes.stats
            assert mq.counts(Q)["completed"] == n
            row[kind] = (cpu / n * 1e6, server / n * 1e6)
        out.append(row)
    return out


def cost_of(plain: list[dict], reporting: list[dict], what: str) -> float:
    """The writes' cost in ``what`` (``rate``: the share of the plain rate
    lost; ``cpu_us``: the share added), %, from the medians of the rounds."""
    both = statistics.median(r[what] for r in reporting) / statistics.median(r[what] for r in plain)
    return 100 * (1 - both if what == "rate" else both - 1)


def interval(plain: list[dict], reporting: list[dict], what: str) -> tuple[float, float]:
    """A 90% interval of ``cost_of`` (%): the 5th and 95th percentiles of it
    over 2,000 resamplings of the rounds' pairs, with replacement (the
    bootstrap), drawn from a fixed seed: how far the run's own noise moves
    the figure."""
    draw, pairs = random.Random(28), list(zip(plain, reporting, strict=True))
    costs = []
    for _ in range(2000):
        sample = draw.choices(pairs, k=len(pairs))
        costs.append(cost_of([p for p, _ in sample], [r for _, r in sample], what))
    costs.sort()
    return costs[100], costs[1899]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000, help="jobs per drain (default %(default)s)")
    p.add_argument(
        "--rounds", type=int, default=3, help="drains of each kind (default %(default)s)"
    )
    p.add_argument("--concurrency", type=int, default=8, help="handler threads (default 8)")
    p.add_argument(
        "--write-path",
        action="store_true",
        help="measure the writes alone on one thread instead (write_path: --jobs jobs, "
        "--rounds sends; at most 100 rounds, so no job log is trimmed)",
    )
    p.add_argument(
        "--complete-path",
        action="store_true",
        help="measure the completions alone on one thread instead (complete_path: --jobs "
        "jobs, batches of 8, --rounds rounds of plain then reporting jobs)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="run this process on the first CPU and the server on the second "
        "(os.sched_setaffinity; needs two CPUs): the GIL stays on one core",
    )
    args = p.parse_args(argv)
    server = start_server()
    if args.pin:
        first, second, *_ = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(server.proc.pid, {second})
        os.sched_setaffinity(0, {first})  # this thread; the worker's threads inherit it
    try:
        setup_django(server.url, ":memory:")
        _handlers()
        from echomq_django import EchoMQ

        client = redis.Redis.from_url(server.url)
        mq = EchoMQ(client, prefix="emq")
        if args.write_path:
            write_path(mq, client, 200, 2)  # warm: scripts loaded
            rounds = write_path(mq, client, args.jobs, min(args.rounds, 100))
            for what, word in (("host_us", "this process"), ("server_us", "the server")):
                each = ", ".join(f"{r[what]:.1f}" for r in rounds)
                med_ = statistics.median(r[what] for r in rounds)
                print(f"write path, CPU of {word}: {med_:.1f} us/job (median); each: {each}")
            return
        if args.complete_path:
            complete_path(mq, client, 200, 1)  # warm: scripts loaded
            rounds = complete_path(mq, client, args.jobs, args.rounds)
            for kind in ("plain", "reporting"):
                for i, word in ((0, "this process"), (1, "the server")):
                    each = ", ".join(f"{r[kind][i]:.1f}" for r in rounds)
                    med_ = statistics.median(r[kind][i] for r in rounds)
                    print(f"complete path, {kind}, CPU of {word}: {med_:.1f} us/job; each: {each}")
            for i, word in ((0, "this process"), (1, "the server")):
                cost = [r["reporting"][i] - r["plain"][i] for r in rounds]
                print(
                    f"complete path, the writes' CPU of {word}: {statistics.median(cost):.1f} "
                    f"us/job (median); each: " + ", ".join(f"{c:.1f}" for c in cost)
                )
            return
        drain(mq, client, PLAIN, 200, args.concurrency)  # warm: scripts loaded
        drain(mq, client, REPORTING, 200, args.concurrency)
        runs: dict[str, list[dict]] = {PLAIN: [], REPORTING: []}
        for _ in range(args.rounds):
            for name in (PLAIN, REPORTING):
                runs[name].append(drain(mq, client, name, args.jobs, args.concurrency))

        def med(name: str, what: str) -> float:
            return statistics.median(r[what] for r in runs[name])

        for name in (PLAIN, REPORTING):
            print(
                f"{name:16} {med(name, 'rate'):8.0f} jobs/s   Redis {med(name, 'redis_us'):6.1f}"
                f" us/job   CPU {med(name, 'cpu_us'):6.1f} us/job   "
                f"{med(name, 'trips'):5.3f} round trips of writes/job"
            )
        for what, word in (("rate", "drain rate"), ("cpu_us", "CPU per job")):
            each = zip(runs[PLAIN], runs[REPORTING], strict=True)
            pairs = [cost_of([p], [r], what) for p, r in each]  # a round's: its own medians
            low, high = interval(runs[PLAIN], runs[REPORTING], what)
            print(
                f"cost in {word}: {cost_of(runs[PLAIN], runs[REPORTING], what):.1f}% of the "
                f"medians (90% interval {low:.1f} to {high:.1f}%); each round's (plain, then "
                "reporting): " + ", ".join(f"{c:.1f}%" for c in pairs)
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
