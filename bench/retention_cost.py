"""``python -m bench.retention_cost``: what retention costs the wide 1+10,000
resolve (the target: at most 10% of its rate;
docs/explanation/lifecycle.md#retentions-cost-on-the-wide-resolve).

One private redis-server; in one process a burst ``Worker`` (concurrency 50)
resolves a parent with 10,000 children on one queue, while a second thread
plays the pump's part: ``prune`` on the queue every 0.2 s (the pump's sweep
cadence) with the default retention (completed: 1,000), so ~9,000 finished
children are removed during the resolve. "off" runs the same with the
thread idle. Rounds alternate off / on; the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import redis

from echomq_django.testing.redis_server import start_server

from .soak import setup_django

Q = "wide"


def _redis_time(client, mq) -> dict[str, int]:
    """Redis' own time (us) per script since the last SLOWLOG RESET: the
    machine's noise does not reach it."""
    names = {s.sha: n for n, s in mq.scripts._scripts.items()}
    out: dict[str, int] = {}
    for entry in client.slowlog_get(-1):
        cmd = entry["command"].split()
        if cmd and cmd[0].upper() == b"EVALSHA":
            name = names.get(cmd[1].decode(), "?")
            out[name] = out.get(name, 0) + entry["duration"]
    return out


def _round(url: str, children: int, on: bool) -> tuple[float, int, dict]:
    from echomq_django import EchoMQ, Flow, Worker

    mq = EchoMQ(redis.Redis.from_url(url))
    mq.client.flushall()
    mq.add_flow(Flow(Q, "bench.root", {}, children=[
        Flow(Q, "bench.leaf", {"i": i}) for i in range(children)]))  # fmt: skip
    pruner = EchoMQ(redis.Redis.from_url(url))
    stop, removed = threading.Event(), [0]

    def prune():
        while not stop.wait(0.2):
            if on:
                removed[0] += pruner.lifecycle.prune(Q).removed

    thread = threading.Thread(target=prune)
    mq.client.config_set("slowlog-log-slower-than", 0)
    mq.client.config_set("slowlog-max-len", 1_000_000)
    mq.client.slowlog_reset()
    thread.start()
    started = time.perf_counter()
    Worker([Q], concurrency=50, mq=mq, batch=50).run(burst=True)
    elapsed = time.perf_counter() - started
    stop.set()
    thread.join()
    return elapsed, removed[0], _redis_time(mq.client, mq)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.retention_cost", description=__doc__)
    p.add_argument("--children", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = p.parse_args(argv)
    server = start_server()
    try:
        setup_django(server.url, ":memory:")
        import bench.handlers  # noqa: F401  (bench.root / bench.leaf)

        times: dict = {False: [], True: []}
        shares = []
        for _ in range(args.rounds):
            for on in (False, True):
                elapsed, removed, spent = _round(server.url, args.children, on)
                times[on].append(elapsed)
                if on:
                    rest = sum(v for k, v in spent.items() if k != "prune")
                    shares.append(spent.get("prune", 0) / max(rest, 1))
                    print(f"  Redis time: prune {spent.get('prune', 0) / 1000:.1f} ms, the "
                          f"resolve's scripts {rest / 1000:.1f} ms")  # fmt: skip
                rate = (args.children + 1) / elapsed
                print(f"retention {'on ' if on else 'off'}: {elapsed:.3f} s "
                      f"({rate:,.0f} jobs/s), {removed} rows pruned")  # fmt: skip
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"median: off {off:.3f} s, on {on:.3f} s: retention costs "
              f"{(on / off - 1) * 100:+.1f}% of the resolve time (target <= 10%)")  # fmt: skip
        # each round's on against the off just before it: drift between rounds cancels
        pairs = sorted(b / a for a, b in zip(times[False], times[True], strict=True))
        print(f"on/off pair by pair: median {statistics.median(pairs):.3f} "
              f"(min {pairs[0]:.3f}, max {pairs[-1]:.3f}, {len(pairs)} pairs)")  # fmt: skip
        print(f"median Redis time of prune: {statistics.median(shares) * 100:.1f}% of the "
              "resolve's own script time")  # fmt: skip
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
