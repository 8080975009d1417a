"""Plain jobs (docs/explanation/performance.md#plain-jobs-and-bulk-enqueue):
10,000 independent jobs, ours and BullMQ's, on
the same server in one run.

- **bulk add**: the ``N`` jobs landed in one call: ``enqueue_many`` (ours)
  and ``Queue.addBulk`` (BullMQ); ours one ``enqueue`` at a time too, for
  scale. The job descriptions are built before the clock starts.
- **drain**: the same ``N`` jobs, added before the clock starts, run by the
  flow benchmark's worker layout (``--workers``, real processes, a trivial
  handler); from the moment the waiting workers are told to start until
  nothing is pending or active (polled every 2 ms), in jobs per second.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import redis

from . import procs
from .runner import POLL_S, READY_TIMEOUT_S
from .topologies import LEAF, QUEUE

N = 10_000


def _payloads(n: int) -> list[dict]:
    return [{"i": i} for i in range(n)]


class OurPlain:
    name = "echomq"

    def __init__(self, url: str, layout) -> None:
        from echomq_django import EchoMQ

        self.url, self.layout = url, layout
        self.mq = EchoMQ(redis.Redis.from_url(url), prefix=procs.PREFIX)

    def add_bulk(self, n: int) -> float:
        jobs = [(LEAF, p) for p in _payloads(n)]
        started = time.perf_counter()
        self.mq.enqueue_many(QUEUE, jobs)
        return time.perf_counter() - started

    def add_one_by_one(self, n: int) -> float:
        payloads = _payloads(n)
        started = time.perf_counter()
        for p in payloads:
            self.mq.enqueue(QUEUE, LEAF, p)
        return time.perf_counter() - started

    def left(self, pipe) -> None:
        k = self.mq.keys
        pipe.llen(k.queue_key(QUEUE, "pending"))
        pipe.zcard(k.queue_key(QUEUE, "active"))

    def processes(self, ctx, ready, go, stop, results) -> list:
        return [
            ctx.Process(
                target=procs.our_worker,
                daemon=True,
                args=(
                    self.url,
                    [QUEUE],
                    self.layout.concurrency,
                    {},
                    None,
                    ready,
                    go,
                    stop,
                    results,
                ),
            )
            for _ in range(self.layout.procs)
        ]

    def close(self) -> None:
        self.mq.client.close()


class PeerPlain:
    name = "bullmq"

    def __init__(self, url: str, layout) -> None:
        import warnings

        from bullmq import Queue

        warnings.simplefilter("ignore")
        self.url, self.layout = url, layout
        self.loop = asyncio.new_event_loop()
        self.queue = Queue(QUEUE, {"connection": url})

    def add_bulk(self, n: int) -> float:
        jobs = [{"name": LEAF, "data": p} for p in _payloads(n)]
        started = time.perf_counter()
        self.loop.run_until_complete(self.queue.addBulk(jobs))
        return time.perf_counter() - started

    def left(self, pipe) -> None:
        pipe.llen(f"bull:{QUEUE}:wait")
        pipe.llen(f"bull:{QUEUE}:active")

    def processes(self, ctx, ready, go, stop, results) -> list:
        return [
            ctx.Process(
                target=procs.peer_worker,
                daemon=True,
                args=(self.url, [(QUEUE, self.layout.concurrency)], None, ready, go, stop, results),
            )
            for _ in range(self.layout.procs)
        ]

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.queue.close())
        finally:
            self.loop.close()


def run_side(side, url: str, n: int = N, timeout: float = 300.0) -> dict:
    """Bulk add (timed, then flushed), then a drain of ``n`` jobs."""
    client = redis.Redis.from_url(url)
    row = {"system": side.name, "jobs": n, "layout": str(side.layout)}
    try:
        client.flushall()
        side.add_bulk(100)  # warm: scripts loaded
        client.flushall()
        row["bulk_add_s"] = side.add_bulk(n)
        if hasattr(side, "add_one_by_one"):
            client.flushall()
            row["one_by_one_add_s"] = side.add_one_by_one(n)
        client.flushall()
        ctx = multiprocessing.get_context("spawn")
        ready, results = ctx.Queue(), ctx.Queue()
        go, stop = ctx.Event(), ctx.Event()
        processes = side.processes(ctx, ready, go, stop, results)
        for p in processes:
            p.start()
        try:
            for _ in processes:
                ready.get(timeout=READY_TIMEOUT_S)
            side.add_bulk(n)
            time.sleep(0.3)
            go.set()
            started = time.perf_counter()
            deadline = started + timeout
            while time.perf_counter() < deadline:
                pipe = client.pipeline(transaction=False)
                side.left(pipe)
                if not any(pipe.execute()):
                    break
                time.sleep(POLL_S)
            row["drain_s"] = time.perf_counter() - started
            row["jobs_per_s"] = n / row["drain_s"]
        finally:
            stop.set()
            for p in processes:
                p.join(15)
                if p.is_alive():
                    p.kill()
                    p.join()
    finally:
        client.flushall()
        client.close()
    return row


def format_rows(rows: list[dict]) -> str:
    """The plain-jobs table (markdown)."""
    lines = [
        "| system | jobs | bulk add ms | one-by-one add ms | drain s | jobs/s | workers |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        one = r.get("one_by_one_add_s")
        lines.append(
            f"| {r['system']} | {r['jobs']:,} | {r['bulk_add_s'] * 1000:,.1f} | "
            f"{'' if one is None else f'{one * 1000:,.1f}'} | {r['drain_s']:.3f} | "
            f"{r['jobs_per_s']:,.0f} | {r['layout']} |"
        )
    if len(rows) == 2:
        ours, theirs = rows
        lines.append(
            f"| **ours vs bullmq** | | **{theirs['bulk_add_s'] / ours['bulk_add_s']:.1f}x "
            f"faster** | | | **{ours['jobs_per_s'] / theirs['jobs_per_s']:.1f}x** | |"
        )
    return "\n".join(lines)
