"""``python -m bench.canvas_chain``: a chain of three links on an idle
worker, add to the last link's result, against three single jobs added and
waited for one after the other (the target: the chain's p50 at most 1.5x
the three round trips'; docs/explanation/canvas.md#cost).

One private redis-server; one worker (concurrency 1) on a thread, blocked
on its queue between jobs. Each link reads the link before's result
(``previous_result``) and adds one; a single job returns its payload plus
one. Both wait with ``wait()`` (a blocking read of the job's done stream).
Samples alternate; p50 and p90 are printed.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import redis

from echomq_django.testing.redis_server import start_server

from .soak import setup_django

Q = "chain"


def _link(job):
    import echomq_django as emq

    before = emq.previous_result(job)
    return (job.payload["n"] if before is None else before) + 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.canvas_chain", description=__doc__)
    p.add_argument("--samples", type=int, default=200, help="samples of each (default 200)")
    args = p.parse_args(argv)
    server = start_server()
    try:
        setup_django(server.url, ":memory:")
        import echomq_django as emq
        from echomq_django import EchoMQ, Worker

        emq.handler("bench.link")(_link)
        mq = EchoMQ(redis.Redis.from_url(server.url))
        worker = Worker([Q], concurrency=1, mq=EchoMQ(redis.Redis.from_url(server.url)))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        link = emq.task("bench.link", queue=Q, n=0)

        def singles() -> int:
            value = 0
            for _ in range(3):
                job_id = mq.enqueue(Q, "bench.link", {"n": value})
                value = mq.wait(Q, job_id, timeout_s=10).result
            return value

        def chain() -> int:
            return mq.wait(emq.chain(link, link, link).enqueue(mq=mq), timeout_s=10).result

        times: dict = {"3 single jobs": [], "chain of 3": []}
        for _ in range(args.samples):
            for name, run in (("3 single jobs", singles), ("chain of 3", chain)):
                started = time.perf_counter()
                assert run() == 3
                times[name].append(time.perf_counter() - started)
        worker.stop()
        thread.join(30)
        for name, got in times.items():
            got.sort()
            print(f"{name}: p50 {statistics.median(got) * 1000:.2f} ms, "
                  f"p90 {got[int(len(got) * 0.9)] * 1000:.2f} ms")  # fmt: skip
        ratio = statistics.median(times["chain of 3"]) / statistics.median(times["3 single jobs"])
        print(f"chain p50 / three round trips p50: {ratio:.3f} (target <= 1.5)")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
