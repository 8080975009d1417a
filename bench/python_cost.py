"""``python -m bench.python_cost``: the host's Python CPU time, alone, in the
two hot paths (docs/explanation/performance.md#the-workers-python):

* the add: ``plan()`` of a 1+N wide flow, then its ``enqueue_flow``
  arguments (the flat JSON), per node; no Redis needed;
* the worker: ``EchoMQ.claim`` (the script call, the reply and the ``Job``
  decoding) and ``complete_many``, per job, on a private redis-server
  (``--cluster``: a private 3-master Redis Cluster, the test rig), in
  batches of ``--batch`` (a worker's free threads).

CPU time of this process only (``time.process_time``), the garbage collector
off inside each timed part: on a shared machine it moves far less than wall
time. Every figure is the median of ``--repeat`` rounds. Whether redis-py
found ``hiredis`` (the ``[fast]`` extra) is printed with the figures.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import redis
import redis.utils

from echomq_django import EchoMQ, Flow
from echomq_django.core import flows as _flows
from echomq_django.core.landing import steps
from echomq_django.testing.redis_server import start_server


def add_cost(mq: EchoMQ, n: int) -> tuple[float, float]:
    """(plan, flat argument) CPU µs per node of one 1+``n`` flow."""
    flow = Flow(
        "q", "bench.root", {}, children=[Flow("q", "bench.leaf", {"i": i}) for i in range(n)]
    )
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        plan = _flows.plan(flow, mq.wire.encode, encode_many=mq.wire.encode_many)
        t1 = time.process_time()
        for queue, groups in steps(plan, mq.wire.flow_chunk):
            mq.flows._step_call(queue, groups, "write")
        t2 = time.process_time()
    finally:
        gc.enable()
    return (t1 - t0) / (n + 1) * 1e6, (t2 - t1) / (n + 1) * 1e6


def worker_cost(mq: EchoMQ, n: int, batch: int) -> tuple[float, float]:
    """(claim, complete) CPU µs per job of this process, draining ``n`` jobs."""
    if isinstance(mq.client, redis.RedisCluster):
        mq.client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        mq.client.flushall()
    mq.enqueue_many("q", [("bench.leaf", {"i": i}) for i in range(n)])
    claim = complete = 0.0
    done = 0
    gc.collect()
    gc.disable()
    try:
        while True:
            t0 = time.process_time()
            jobs = mq.claim("q", batch)
            t1 = time.process_time()
            if not jobs:
                break
            mq.complete_many([(job, job.payload["i"]) for job in jobs])
            t2 = time.process_time()
            claim, complete, done = claim + t1 - t0, complete + t2 - t1, done + len(jobs)
    finally:
        gc.enable()
    assert done == n, (done, n)
    return claim / n * 1e6, complete / n * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="children of the flow")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs drained per round")
    parser.add_argument("--batch", type=int, default=50, help="claim batch (default 50)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--redis-url", help="use this Redis (FLUSHALLed!) instead of a private one")
    parser.add_argument(
        "--cluster", action="store_true", help="on a private 3-master Redis Cluster (the test rig)"
    )
    args = parser.parse_args(argv)
    if args.cluster:
        from tests.support.rigs import start_cluster  # a checkout's: the bench runs from one

        server = start_cluster()
        client = redis.RedisCluster.from_url(server.url)
    else:
        server = None if args.redis_url else start_server()
        client = redis.Redis.from_url(args.redis_url or server.url)
    try:
        mq = EchoMQ(client, prefix="emq")
        add = [add_cost(mq, args.nodes) for _ in range(args.repeat)]
        work = [worker_cost(mq, args.jobs, args.batch) for _ in range(args.repeat)]
    finally:
        if server is not None:
            server.stop()
    med = statistics.median
    where = "a 3-master Cluster" if args.cluster else "one server"
    print(f"hiredis: {'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}; {where}; ", end="")
    print(f"medians of {args.repeat}")
    print(f"  add 1+{args.nodes:,}: plan {med(a for a, _ in add):.2f} µs/node, ", end="")
    print(f"flat argument {med(b for _, b in add):.2f} µs/node")
    print(f"  worker, batch {args.batch}: claim {med(c for c, _ in work):.2f} µs/job, ", end="")
    print(f"complete {med(d for _, d in work):.2f} µs/job (this process's CPU)")


if __name__ == "__main__":
    main()
