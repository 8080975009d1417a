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
"""

from __future__ import annotations

import argparse
import os
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=10, help="workers (default %(default)s)")
    p.add_argument("--jobs", type=int, default=60, help="jobs for the cap (default %(default)s)")
    p.add_argument("--hold-ms", type=int, default=50, help="each job's run (default %(default)s)")
    p.add_argument("--idle-s", type=float, default=10, help="idle window (default %(default)s)")
    p.add_argument("--rate-s", type=int, default=60, help="rate-limited s (default %(default)s)")
    p.add_argument("--threads", type=int, default=4, help="per worker (default %(default)s)")
    args = p.parse_args(argv)
    global THREADS
    THREADS = args.threads
    server = start_server()
    setup_django(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        concurrency(client, args.workers, args.jobs, args.hold_ms, args.idle_s)
        sliding(client, args.workers, args.rate_s)
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
