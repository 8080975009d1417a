"""The process pool's limits, on one private redis-server
(docs/howto/process-pool.md#time-limits, docs/howto/process-pool.md#autoscaling).

``python -m bench.pool_limits [--hung 100] [--timeout-ms 200] [--backlog 10000]``

- **hung**: ``--hung`` jobs in a row whose handler sleeps in C with SIGTERM
  blocked (only SIGKILL ends it), each with ``--timeout-ms``, on a pool of
  one process: the longest gap between one job's start and the next one's
  (its time limit, the kill, a fresh process), and the pool's size and
  resident memory (the worker's and its children's, MiB) before and after.
- **autoscale**: ``Worker(pool="process", autoscale=(8, 1))`` started on a
  backlog of ``--backlog`` plain jobs: seconds until it runs 8 processes,
  then, once the backlog is drained, seconds of idle until it is back to 1.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import threading
import time

from echomq_django import handler
from echomq_django.testing.redis_server import start_server

from . import procs

QUEUE = "limits"


@handler("bench.hang")
def hang(job):
    """Sleeps in C with SIGTERM blocked: only SIGKILL ends it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    time.sleep(3600)


def _rss_mib(pids) -> float:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            continue
    return total / (1 << 20)


def _until(predicate, timeout: float) -> float:
    """Seconds until ``predicate()`` holds (checked every 5 ms), or inf."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.005)
    return float("inf")


def hung(mq, jobs: int, timeout_ms: int) -> dict:
    from echomq_django import Worker

    mq.client.flushall()
    worker = Worker([QUEUE], concurrency=1, mq=mq, pool="process", register=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    _until(lambda: worker.loop.pool is not None and worker.loop.pool.pids(), 30)
    pool = worker.loop.pool
    before = (len(pool.pids()), _rss_mib([os.getpid(), *pool.pids()]))
    for i in range(jobs):
        mq.enqueue(QUEUE, "bench.hang", {}, job_id=f"h{i}", timeout_ms=timeout_ms, max_attempts=1)
    _until(lambda: mq.counts(QUEUE)["dead"] == jobs, jobs * (timeout_ms / 1000 + 5))
    _until(lambda: pool.leaving == 0, 10)
    after = (len(pool.pids()), _rss_mib([os.getpid(), *pool.pids()]))
    starts = sorted(mq.get_job(QUEUE, f"h{i}").started_at for i in range(jobs))
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    worker.stop()
    thread.join(30)
    return {"dead": mq.counts(QUEUE)["dead"], "max_gap_ms": max(gaps), "before": before,
            "after": after, "replaced": pool.replaced}  # fmt: skip


def autoscale(mq, backlog: int) -> tuple[float, float]:
    from echomq_django import Worker

    from . import handlers  # noqa: F401  (bench.one)

    mq.client.flushall()
    mq.enqueue_many(QUEUE, [("bench.one", {"i": i}) for i in range(backlog)])
    worker = Worker([QUEUE], mq=mq, pool="process", autoscale=(8, 1), register=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    started = time.monotonic()
    thread.start()
    grown = _until(lambda: worker.loop.pool is not None and len(worker.loop.pool.pids()) >= 8, 30)
    grown = min(grown, time.monotonic() - started)
    _until(lambda: mq.counts(QUEUE)["completed"] == backlog, 300)
    shrunk = _until(lambda: len(worker.loop.pool.pids()) == 1, 120)
    worker.stop()
    thread.join(30)
    return grown, shrunk


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hung", type=int, default=100)
    p.add_argument("--timeout-ms", type=int, default=200)
    p.add_argument("--backlog", type=int, default=10_000)
    args = p.parse_args(argv)
    server = start_server()
    try:
        procs.setup_django(server.url)
        mq = procs._mq(server.url)
        h = hung(mq, args.hung, args.timeout_ms)
        print(f"hung: {h['dead']} of {args.hung} jobs killed at {args.timeout_ms} ms; longest "
              f"start-to-next-start {h['max_gap_ms']} ms (limit + kill + fresh process); pool "
              f"{h['before'][0]} -> {h['after'][0]} processes, resident "
              f"{h['before'][1]:.0f} -> {h['after'][1]:.0f} MiB")  # fmt: skip
        grown, shrunk = autoscale(mq, args.backlog)
        print(
            f"autoscale 8,1 on {args.backlog} jobs: 1 -> 8 processes in {grown:.2f} s; "
            f"back to 1 after {shrunk:.1f} s idle"
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
