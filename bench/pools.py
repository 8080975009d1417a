"""Thread pool against process pool, on one private redis-server, in one run
(docs/howto/process-pool.md#how-it-works).

``python -m bench.pools [--jobs 10000] [--concurrency 8] [--workers 2] [--samples 200]``

- **drain**: ``--jobs`` plain jobs with a trivial handler (``bench.one``),
  added before the clock starts, run by ``--workers`` worker processes of
  ``--concurrency`` handlers each (``Worker(pool=...)``); from the moment
  the waiting workers are told to start until every job is completed, in
  jobs per second; and the CPU each job cost (µs): the worker processes'
  from ``go`` to their end (their handler processes included, counted as
  the workers reap them) and the redis-server's. On a machine shared with other work the CPU figures
  move far less than the rates, and a pool that is CPU-bound drains at
  about the inverse of its CPU per job.
- **start latency**: on one idle worker, the time from ``enqueue`` to the
  handler's first line (``bench.stamp`` writes ``time.time()``), p50 and
  p95 over ``--samples`` jobs added one at a time, in ms.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import resource
import statistics
import time

import redis

from echomq_django import handler
from echomq_django.testing.redis_server import start_server

from . import procs

QUEUE = "plain"


def _worker(url, pool, concurrency, ready, go, stop, used=None) -> None:
    procs.setup_django(url)
    from echomq_django import Worker

    from . import handlers  # noqa: F401  (bench.one)

    worker = Worker([QUEUE], concurrency=concurrency, mq=procs._mq(url), pool=pool,
                    register=False)  # fmt: skip
    ready.set()
    go.wait()
    if stop is None:
        before = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)
        worker.run(burst=True)  # its handler processes are reaped by its end
        used.put(_cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN) - before)
    else:
        import threading

        threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
        worker.run()


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@handler("bench.stamp")
def stamp(job):
    """Records when it started (s since the epoch)."""
    _client(job.payload["url"]).rpush("bench:stamps", repr(time.time()))


def _server_cpu_s(pid: int) -> float:
    """The redis-server's CPU so far (s): user + system, ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_s(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def drain(url: str, pool: str, jobs: int, workers: int, concurrency: int, server_pid: int,
          name: str = "bench.one"):  # fmt: skip
    """``(jobs/s, worker µs/job, redis-server µs/job)`` for ``pool``,
    ``jobs`` plain jobs of handler ``name``."""
    mq = procs._mq(url)
    mq.client.flushall()
    mq.enqueue_many(QUEUE, [(name, {"i": i}) for i in range(jobs)])
    ctx = multiprocessing.get_context("spawn")
    ready = [ctx.Event() for _ in range(workers)]
    go = ctx.Event()
    used = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(url, pool, concurrency, r, go, None, used))
          for r in ready]  # fmt: skip
    for p in ps:
        p.start()
    for r in ready:
        r.wait(60)
    server_cpu = _server_cpu_s(server_pid)
    started = time.perf_counter()
    go.set()
    cpu = sum(used.get(timeout=600) for _ in ps)  # each worker's from `go` to its end
    for p in ps:
        p.join()
    took = time.perf_counter() - started
    counts = mq.counts(QUEUE)  # completed ones past KEEP_COMPLETED's 1,000 may be pruned
    assert counts["completed"] and not any(counts[s] for s in ("pending", "active", "delayed",
                                                                "dead")), counts  # fmt: skip
    per_job = 1e6 / jobs
    return (jobs / took, cpu * per_job,
            (_server_cpu_s(server_pid) - server_cpu) * per_job)  # fmt: skip


def start_latency(url: str, pool: str, samples: int) -> tuple[float, float]:
    """p50 and p95 (ms) from enqueue to the handler's start, one idle worker."""
    mq = procs._mq(url)
    mq.client.flushall()
    ctx = multiprocessing.get_context("spawn")
    ready, go, stop = ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_worker, args=(url, pool, 1, ready, go, stop))
    p.start()
    ready.wait(60)
    go.set()
    time.sleep(0.5)  # the worker blocks on its wake key: idle
    took = []
    for _ in range(samples):
        before = time.time()
        mq.enqueue(QUEUE, "bench.stamp", {"url": url})
        _, value = mq.client.blpop(["bench:stamps"], 10)
        took.append((float(value) - before) * 1000)
        time.sleep(0.01)  # idle again
    stop.set()
    p.join(30)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.95) - 1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--samples", type=int, default=200)
    args = p.parse_args(argv)
    server = start_server()
    try:
        procs.setup_django(server.url)
        runs = {
            pool: drain(server.url, pool, args.jobs, args.workers, args.concurrency,
                        server.proc.pid)
            for pool in ("thread", "process")
        }  # fmt: skip
        print(f"drain, {args.jobs} plain jobs, {args.workers} workers x {args.concurrency}:")
        for pool, (rate, cpu, server_cpu) in runs.items():
            print(f"  {pool:8} {rate:8.0f} jobs/s; CPU per job: workers {cpu:4.0f} µs, "
                  f"redis-server {server_cpu:4.0f} µs")  # fmt: skip
        ratio = runs["process"][0] / runs["thread"][0]
        (_, cpu_t, srv_t), (_, cpu_p, srv_p) = runs["thread"], runs["process"]
        print(
            f"  process/thread: {ratio:.0%} (rate); "
            f"{(cpu_t + srv_t) / (cpu_p + srv_p):.0%} (inverse CPU per job)"
        )
        for pool in ("thread", "process"):
            p50, p95 = start_latency(server.url, pool, args.samples)
            print(f"start latency, idle worker, {pool}: p50 {p50:.2f} ms, p95 {p95:.2f} ms")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
