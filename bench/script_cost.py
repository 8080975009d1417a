"""``python -m bench.script_cost``: the Redis time of a flow's claims and
completions, per node (docs/explanation/performance.md#the-resolves-redis-time).

On a private redis-server, a wide 1+N flow (the benchmark's names) is
added; then, in this one process, every leaf is claimed in batches of
``--batch`` and, after all are claimed, completed in batches of the same
size (``complete_many``: one ``complete`` script per batch). ``INFO
commandstats`` gives the ``EVALSHA`` time (µs, the server's own clock: no
client scheduling in the figure) of the claims and of the completions, each
per node, and the commands the scripts ran per node (``--cross``: the
leaves on another queue than the root's). ``--runs`` repeats it
on a new flow; two builds compare by running this from each tree in turn.

    .venv/bin/python -m bench.script_cost [--nodes 5000] [--batch 50] [--runs 3] [--cross]
"""

from __future__ import annotations

import argparse

import redis

from echomq_django import EchoMQ, Flow
from echomq_django.testing.redis_server import start_server

from .topologies import CHILD_QUEUE, LEAF, QUEUE, ROOT

LEASE_MS = 600_000  # no lease runs out while a run claims and completes (ms)


def _stats(client) -> dict[str, dict]:
    return client.info("commandstats")


def _per_node(stats: dict[str, dict], n: int) -> tuple[float, float]:
    """(EVALSHA µs per node, commands the scripts ran per node)."""
    script = stats.get("cmdstat_evalsha", {})
    inner = sum(
        v["calls"]
        for k, v in stats.items()
        if k not in ("cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info")
    )
    return script.get("usec", 0) / n, inner / n


def run_once(client, n: int, batch: int, cross: bool = False) -> dict[str, tuple[float, float]]:
    """One flow's claims and completions: ``{"claim": (µs, commands),
    "complete": (µs, commands)}`` per node. ``cross``: the leaves on
    another queue than the root's (on one server their completions resolve
    the root in the same script: docs/explanation/protocol.md#cross-queue-scripts-on-one-server)."""
    client.flushall()
    mq = EchoMQ(client, prefix="emq")
    leaves = CHILD_QUEUE if cross else QUEUE
    kids = [Flow(leaves, LEAF, {"i": i}) for i in range(n)]
    mq.add_flow(Flow(QUEUE, ROOT, {}, children=kids))
    client.config_resetstat()
    claimed = []
    while jobs := mq.claim(leaves, batch, LEASE_MS):
        claimed.append(jobs)
    claims = _per_node(_stats(client), n)
    client.config_resetstat()
    for jobs in claimed:
        mq.complete_many([(job, job.payload) for job in jobs])
    completes = _per_node(_stats(client), n)
    left = len(mq.claim(QUEUE, batch, LEASE_MS))
    if left != 1:
        raise RuntimeError(f"the root was not released: {left} claimable after the leaves")
    return {"claim": claims, "complete": completes}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5_000, help="leaves of the flow")
    parser.add_argument("--batch", type=int, default=50, help="jobs per claim and per complete")
    parser.add_argument("--runs", type=int, default=3, help="flows, one after another")
    parser.add_argument("--cross", action="store_true", help="the leaves on another queue")
    args = parser.parse_args(argv)
    for name, value in (("--nodes", args.nodes), ("--batch", args.batch), ("--runs", args.runs)):
        if value < 1:
            parser.error(f"{name} must be at least 1 (got {value})")
    server = start_server()
    try:
        client = redis.Redis.from_url(server.url)
        print(
            "| run | claim µs/node | claim commands/node "
            "| complete µs/node | complete commands/node |"
        )
        print("|--:|--:|--:|--:|--:|")
        for i in range(args.runs):
            got = run_once(client, args.nodes, args.batch, args.cross)
            (cu, cc), (pu, pc) = got["claim"], got["complete"]
            print(f"| {i + 1} | {cu:.2f} | {cc:.2f} | {pu:.2f} | {pc:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
