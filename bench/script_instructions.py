"""``python -m bench.script_instructions``: the instructions Redis spends per
node on a wide flow's claims and on its completions, counted by valgrind's
callgrind (docs/explanation/performance.md#the-resolves-redis-time), so an
A/B of the scripts holds still on a busy machine where ``bench.script_cost``'s
times do not (repeatable to about 0.3%).

A redis-server runs under ``valgrind --tool=callgrind`` with its
instrumentation off; a wide 1+``--nodes`` flow (the benchmark's names) is
added, one job of another queue claimed and completed twice (the scripts
loaded and run once), then instrumentation is switched on: every leaf is
claimed in batches of ``--batch`` (one dump), then completed in batches of
the same size (``complete_many``, another dump). ``--lua DIR`` runs the
scripts of another checkout's ``lua/`` on the same server binary. Needs
``valgrind`` and ``callgrind_control`` on PATH.

    .venv/bin/python -m bench.script_instructions [--nodes 1000] [--batch 50] [--lua DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import redis

from .prune_instructions import _control, callgrind_server, dumps
from .topologies import LEAF, QUEUE, ROOT

LEASE_MS = 600_000  # no lease runs out under valgrind's slowness (ms)


def measure(nodes: int, batch: int, lua: Path | None = None) -> tuple[float, float]:
    """(claim, complete) instructions per node."""
    with callgrind_server("script_instructions", lua) as (server, url, folder):
        from echomq_django import EchoMQ, Flow

        mq = EchoMQ(redis.Redis.from_url(url))
        kids = [Flow(QUEUE, LEAF, {"i": i}) for i in range(nodes)]
        mq.add_flow(Flow(QUEUE, ROOT, {}, children=kids))
        for _ in range(2):  # the scripts loaded and run once, outside the counts
            mq.enqueue("warm", LEAF, {"i": 0})
            mq.complete_many([(job, None) for job in mq.claim("warm", 1, LEASE_MS)])
        _control(server.pid, "-i", "on")
        claimed = []
        while len(claimed) < nodes and (jobs := mq.claim(QUEUE, batch, LEASE_MS)):
            claimed.extend(jobs)
        _control(server.pid, "-d", "claims")
        for at in range(0, len(claimed), batch):
            mq.complete_many([(job, job.payload) for job in claimed[at : at + batch]])
        _control(server.pid, "-d", "completes")
        if len(claimed) != nodes or len(mq.claim(QUEUE, 1, LEASE_MS)) != 1:
            raise RuntimeError(
                f"{len(claimed)} leaves claimed of {nodes}, or the root not released"
            )
        counts = dict(dumps(folder))
        return counts["claims"] / nodes, counts["completes"] / nodes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000, help="leaves of the flow")
    parser.add_argument("--batch", type=int, default=50, help="jobs per claim and per complete")
    parser.add_argument("--lua", type=Path, help="run another checkout's lua/ folder")
    args = parser.parse_args(argv)
    for name, value in (("--nodes", args.nodes), ("--batch", args.batch)):
        if value < 1:
            parser.error(f"{name} must be at least 1 (got {value})")
    if args.lua is not None and not (args.lua / "claim.lua").is_file():
        parser.error(f"--lua {args.lua}: no claim.lua there")
    claim, complete = measure(args.nodes, args.batch, args.lua)
    print(f"claim: {claim:,.0f} instructions/node; complete: {complete:,.0f} instructions/node")


if __name__ == "__main__":
    main()
