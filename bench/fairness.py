"""``python -m bench.fairness``: a queue's concurrency cap and the sliding
rate limit under real workers (docs/howto/priorities-rate-limits.md).

Concurrency: ``--workers`` in-process ``Worker`` threads (4 handler threads
each) on a queue with ``CONCURRENCY`` 3 and ``--jobs`` jobs whose handler
holds for ``--hold-ms``; a handler counter records the most running at
once. Then three jobs are held open for ``--idle-s`` seconds with work
waiting, and Redis's command count over that time (``INFO commandstats``,
less this probe's own) gives the commands per second per idle worker.

Sliding rate limit: ``MAX`` 10 per 1000 ms, ``--rate-s`` seconds of work for
the workers; every job's start (its ``started_at``, the Redis host's clock)
is read back and the most starts in any 1000 ms interval is printed, with
how many claims the limiter refused (each one a rest until the window
frees, not a spin).

Groups (docs/explanation/protocol.md#groups; ``--groups``): ``--big`` jobs
in one group, added first, then ``--small`` jobs in each of ``--groups`` - 1
other groups, drained by ``--procs`` worker processes of ``--group-threads``
handler threads each, once with the groups and once with the same jobs and
no group (runs alternate, ``--pairs`` pairs). Printed per run: when the last
small group's last job was done and when 10% of the big group's were (ms
after the start, from each job's ``finished_at``: fair when the first is
earlier), and the whole drain; then the drain ratio plain / grouped per pair
and its median (the target: >= 0.8).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time

import redis

from bench.procs import setup_django
from echomq_django.testing.redis_server import start_server

HELD = threading.Event()
ACTIVE = {"now": 0, "most": 0}
LOCK = threading.Lock()
THREADS = 4  # handler threads per worker (--threads)


def calls(client) -> int:
    return sum(v["calls"] for v in client.info("commandstats").values())


def workers(queue: str, queues: dict, n: int) -> list:
    """``n`` workers of ``THREADS`` handler threads on ``queue``, each on a thread and
    a client of its own, as separate processes would be."""
    from echomq_django import EchoMQ, Worker

    url = os.environ["ECHOMQ_URL"]
    out = []
    for _ in range(n):
        mq = EchoMQ(redis.Redis.from_url(url), queues=queues)
        worker = Worker([queue], concurrency=THREADS, mq=mq, register=False)
        threading.Thread(target=worker.run, daemon=True).start()
        out.append(worker)
    return out


def stop(running) -> None:
    for worker in running:
        worker.stop()
    time.sleep(1.0)  # their loops end (daemon threads: the process never waits on one)


def concurrency(client, n_workers: int, jobs: int, hold_ms: int, idle_s: float) -> None:
    from echomq_django import EchoMQ, handler

    @handler("bench.counted")
    def counted(job):
        with LOCK:
            ACTIVE["now"] += 1
            ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
        if job.payload == "hold":
            HELD.wait(60)
        else:
            time.sleep(hold_ms / 1000)
        with LOCK:
            ACTIVE["now"] -= 1

    client.flushall()
    queues = {"q": {"CONCURRENCY": 3}}
    mq = EchoMQ(client, queues=queues)
    running = workers("q", queues, n_workers)
    try:
        time.sleep(1.0)  # every worker blocked on the queue
        start = time.perf_counter()
        mq.enqueue_many("q", [{"name": "bench.counted", "payload": i} for i in range(jobs)])
        while mq.counts("q")["completed"] < jobs:
            time.sleep(0.05)
        took = time.perf_counter() - start
        print(
            f"concurrency 3, {n_workers} workers x {THREADS} threads, {jobs} jobs of {hold_ms} ms: "
            f"most running at once {ACTIVE['most']}, drained in {took:.2f} s "
            f"(at best {jobs * hold_ms / 3000:.2f} s)"
        )
        mq.enqueue_many("q", [{"name": "bench.counted", "payload": "hold"} for _ in range(3)])
        mq.enqueue_many("q", [{"name": "bench.counted", "payload": i} for i in range(20)])
        while mq.counts("q")["active"] < 3:
            time.sleep(0.05)
        time.sleep(1.0)  # settle: every worker's first look is over
        before = calls(client)
        time.sleep(idle_s)
        spent = calls(client) - before - 1  # our own INFO
        idle = n_workers * THREADS - 3
        print(
            f"  3 held, 20 waiting, {idle} idle handler threads in {n_workers} workers: "
            f"{spent} Redis commands in {idle_s:.0f} s = {spent / idle_s / n_workers:.3f} "
            f"per second per worker (heartbeats and timers included)"
        )
    finally:
        HELD.set()
        stop(running)


def sliding(client, n_workers: int, seconds: int) -> None:
    from echomq_django import EchoMQ, handler

    @handler("bench.noop")
    def noop(job):
        return None

    client.flushall()
    queues = {"r": {"RATE_LIMIT": {"MAX": 10, "PER_MS": 1000, "MODE": "sliding"}}}
    mq = EchoMQ(client, queues=queues)
    n = 10 * seconds
    mq.enqueue_many("r", [{"name": "bench.noop", "payload": i} for i in range(n)])
    ws = workers("r", queues, n_workers)
    try:
        while mq.counts("r")["completed"] < n:
            time.sleep(0.1)
    finally:
        stop(ws)
    ids = [i.decode() for i in client.zrange(mq.keys.queue("r").completed, 0, -1)]
    starts = sorted(int(client.hget(mq.keys.job("r", i), "started_at")) for i in ids)
    worst, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] <= t - 1000:
            j += 1
        worst = max(worst, i - j + 1)
    refused = sum(w.loop.window_waits for w in ws)
    span = (starts[-1] - starts[0]) / 1000
    print(
        f"sliding RATE_LIMIT 10 per 1000 ms, {n} jobs, {n_workers} workers x {THREADS} threads: "
        f"most starts in any 1000 ms {worst}; {n} starts over {span:.1f} s; "
        f"claims refused by the limiter {refused} ({refused / max(span, 1):.1f}/s in all)"
    )


def group_worker(url, queue, threads, ready, go, stop) -> None:
    """A worker process (a spawn target) on ``queue``, its completed jobs all
    kept (their ``finished_at`` is what the run reads back)."""
    setup_django(url)
    import bench.handlers  # noqa: F401  (registers bench.one)
    from echomq_django import EchoMQ, Worker

    keep = {"KEEP_COMPLETED": {"COUNT": 10_000_000, "AGE_S": 86400}}
    mq = EchoMQ(redis.Redis.from_url(url), queues={queue: keep}, prefix="emq")
    worker = Worker([queue], concurrency=threads, mq=mq, register=False)
    mq.client.ping()
    ready.put(os.getpid())
    go.wait()
    threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
    worker.run()


def groups_run(client, url, grouped: bool, args) -> dict:
    """One drain of the groups scenario; returns its figures (ms)."""
    from echomq_django import EchoMQ

    client.flushall()
    mq = EchoMQ(client, prefix="emq")
    big = [("bench.one", i, {"job_id": f"big-{i}", "group": "big"}) for i in range(args.big)]
    small = [
        ("bench.one", i, {"job_id": f"s{g}-{i}", "group": f"s{g}"})
        for g in range(args.groups - 1)
        for i in range(args.small)
    ]
    jobs = big + small
    if not grouped:
        jobs = [(name, payload, {"job_id": o["job_id"]}) for name, payload, o in jobs]
    for i in range(0, len(jobs), 5000):
        mq.enqueue_many("f", jobs[i : i + 5000])
    ctx = multiprocessing.get_context("spawn")
    ready, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=group_worker, args=(url, "f", args.group_threads, ready, go, stop))
        for _ in range(args.procs)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    time.sleep(0.5)
    start = int(client.time()[0]) * 1000 + int(client.time()[1]) // 1000
    go.set()
    completed = mq.keys.queue("f").completed
    try:
        while client.zcard(completed) < len(jobs):
            time.sleep(0.05)
    finally:
        stop.set()
        for p in procs:
            p.join(10)
    done = {k.decode(): int(v) for k, v in client.zrange(completed, 0, -1, withscores=True)}
    bigs = sorted(t for k, t in done.items() if k.startswith("big-"))
    small_last = max(t for k, t in done.items() if not k.startswith("big-"))
    return {
        "small_last": small_last - start,
        "big_10pct": bigs[len(bigs) // 10 - 1] - start,
        "drain": max(done.values()) - start,
    }


def groups(client, url, args) -> None:
    n = args.big + (args.groups - 1) * args.small
    print(
        f"groups: {args.groups} groups, one of {args.big:,} jobs (added first) and "
        f"{args.groups - 1} of {args.small}; {n:,} jobs; {args.procs} worker processes x "
        f"{args.group_threads} threads; {args.pairs} pairs, plain and grouped alternating"
    )
    ratios = []
    for pair in range(args.pairs):
        runs = {}
        for grouped in (False, True) if pair % 2 == 0 else (True, False):
            runs[grouped] = r = groups_run(client, url, grouped, args)
            fair = "fair" if r["small_last"] < r["big_10pct"] else "NOT fair"
            print(
                f"  pair {pair + 1} {'grouped' if grouped else 'plain  '}: last small group's "
                f"last job at {r['small_last']:,} ms, 10% of the big group at "
                f"{r['big_10pct']:,} ms ({fair if grouped else 'no groups'}); "
                f"drain {r['drain']:,} ms ({n / r['drain'] * 1000:,.0f} jobs/s)"
            )
        ratios.append(runs[False]["drain"] / runs[True]["drain"])
        print(f"  pair {pair + 1}: drain plain / grouped = {ratios[-1]:.3f}")
    print(f"  median drain ratio plain / grouped: {statistics.median(ratios):.3f} (target >= 0.8)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=10, help="workers (default %(default)s)")
    p.add_argument("--jobs", type=int, default=60, help="jobs for the cap (default %(default)s)")
    p.add_argument("--hold-ms", type=int, default=50, help="each job's run (default %(default)s)")
    p.add_argument("--idle-s", type=float, default=10, help="idle window (default %(default)s)")
    p.add_argument("--rate-s", type=int, default=60, help="rate-limited s (default %(default)s)")
    p.add_argument("--threads", type=int, default=4, help="per worker (default %(default)s)")
    for flag, default, text in (  # the groups run
        ("--groups", 0, "groups (100; default 0: no groups run)"),
        ("--big", 50_000, "the big group's jobs"),
        ("--small", 10, "each small group's jobs"),
        ("--procs", 2, "worker processes"),
        ("--group-threads", 50, "threads each"),
        ("--pairs", 3, "plain/grouped pairs"),
    ):
        p.add_argument(flag, type=int, default=default, help=f"groups run: {text}")
    p.add_argument("--only-groups", action="store_true", help="skip the other scenarios")
    args = p.parse_args(argv)
    global THREADS
    THREADS = args.threads
    server = start_server()
    setup_django(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        if not args.only_groups:
            concurrency(client, args.workers, args.jobs, args.hold_ms, args.idle_s)
            sliding(client, args.workers, args.rate_s)
        if args.groups:
            groups(client, server.url, args)
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
