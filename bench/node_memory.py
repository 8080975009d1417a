"""``python -m bench.node_memory``: where a flow node's Redis memory goes
(docs/explanation/performance.md#memory-per-node).

On a private redis-server, a wide 1+N flow and a cross-queue one are added
(the benchmark's queue and job names and payloads; ``--cluster``: on a
cluster-enabled server holding every slot); for each it prints the
``used_memory`` delta per node (the benchmark's B/node, without its client
buffer correction), ``MEMORY USAGE`` summed by kind of key per node, and one
leaf row field by field: the bytes each field name and value take in the
row's listpack (Redis 7's encoding: an integer in 2-10 bytes, a string in
its length plus 2-3), whose total decides the row's allocation (jemalloc's
classes: 128, 160, 192... bytes).
"""

from __future__ import annotations

import argparse
import collections
import time

import redis

from echomq_django import EchoMQ, Flow
from echomq_django.testing.redis_server import start_server
from tests.support.rigs import cluster_state

from .topologies import CHILD_QUEUE, LEAF, QUEUE, ROOT


def entry_bytes(text: str) -> int:
    """Bytes of one listpack entry holding ``text`` (listpack.c, Redis 7)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is not None and str(value) == text and -(2**63) <= value < 2**63:
        for size, low, high in ((1, 0, 127), (2, -4096, 4095), (3, -(2**15), 2**15 - 1)):
            if low <= value <= high:
                return size + 1
        for size, bits in ((4, 23), (5, 31)):
            if -(2**bits) <= value < 2**bits:
                return size + 1
        return 10
    length = len(text.encode())
    body = (1 if length < 64 else 2 if length < 4096 else 5) + length
    return body + (1 if body < 128 else 2 if body < 16384 else 3)


def kind_of(key: str) -> str:
    """``job row``, ``job:children``, ``pending``... for a key under the prefix."""
    rest = key.split(":", 2)[-1]
    if rest.startswith("job:"):
        return "job row" if rest.count(":") == 1 else "job:" + rest.rsplit(":", 1)[-1]
    return rest.split(":")[0]


def measure(client, n: int, cross: bool) -> None:
    mq = EchoMQ(client, prefix="emq")
    child_queue = CHILD_QUEUE if cross else QUEUE

    def flow(size: int) -> Flow:
        kids = [Flow(child_queue, LEAF, {"i": i}) for i in range(size)]
        return Flow(QUEUE, ROOT, {}, children=kids)

    mq.add_flow(flow(4))  # scripts loaded, connection made
    client.execute_command("FLUSHALL", "SYNC")  # freed now, not while measured (Valkey 8)
    time.sleep(0.2)
    before = client.info("memory")["used_memory"]
    ref = mq.add_flow(flow(n))
    time.sleep(0.2)
    nodes = n + 1
    delta = (client.info("memory")["used_memory"] - before) / nodes
    print(f"{'cross-queue' if cross else 'wide'} 1+{n:,}: used_memory {delta:.1f} B per node")
    kinds: collections.Counter = collections.Counter()
    for key in client.scan_iter(count=1000):
        kinds[kind_of(key.decode())] += client.memory_usage(key, samples=0)
    for kind, size in kinds.most_common():
        if size / nodes >= 0.1:
            print(f"  {kind:<16} {size / nodes:7.1f} B per node (MEMORY USAGE)")
    key = mq.keys.job(*ref.nodes[-1])
    row = {f.decode(): v.decode() for f, v in client.hgetall(key).items()}
    print(f"  a leaf row: MEMORY USAGE {client.memory_usage(key, samples=0)} B, key {key!r}")
    total = 7  # the listpack's header (6) and end mark (1)
    for field, value in row.items():
        size = entry_bytes(field) + entry_bytes(value)
        total += size
        print(f"    {field:<14} {value[:20]!r:<24} {size:3d} B")
    print(f"    listpack       {total} B (header and end mark included)")
    client.flushall()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="children of each flow")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="a cluster-enabled server holding every slot: the same rows, with the "
        "server's own cost per key in cluster mode",
    )
    args = parser.parse_args(argv)
    if args.nodes < 4:
        parser.error(f"--nodes {args.nodes}: a flow measured has at least 4 children")
    server = start_server(cluster=args.cluster)
    try:
        client = redis.Redis.from_url(server.url)
        if args.cluster:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            while cluster_state(client) != "ok":
                time.sleep(0.05)
        for cross in (False, True):
            measure(client, args.nodes, cross)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
