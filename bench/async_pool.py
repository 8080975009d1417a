"""``async def`` handlers: the thread pool (``async_to_sync``, an event loop
per call) against the async pool (one event loop per worker), on one private
redis-server, in one run (docs/howto/async-handlers.md#the-async-pool).

``python -m bench.async_pool [--jobs 5000] [--workers 1] [--pairs 2]``

Two scenarios, each a drain of ``--jobs`` jobs added before the clock
starts, run by ``--workers`` worker processes (``bench.pools.drain``), in
jobs per second and CPU per job (µs: the workers', the redis-server's):

- **turn**: ``bench.async_turn`` (``await asyncio.sleep(0)``), at
  ``--concurrency-turn`` handlers (default 8);
- **wait**: ``bench.async_wait`` (``await asyncio.sleep(0.05)``, I/O-bound),
  at ``--concurrency-wait`` handlers (default 100): at most
  ``concurrency / 0.05`` jobs per second per worker.

Each scenario runs the pools alternately, ``--pairs`` times (thread, async,
thread, async, ...), and prints every run, as the machine may be shared.
"""

from __future__ import annotations

import argparse

from echomq_django.testing.redis_server import start_server

from . import pools, procs

SCENARIOS = {"turn": "bench.async_turn", "wait": "bench.async_wait"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--concurrency-turn", type=int, default=8)
    p.add_argument("--concurrency-wait", type=int, default=100)
    p.add_argument("--only", choices=sorted(SCENARIOS), default=None)
    args = p.parse_args(argv)
    server = start_server()
    try:
        procs.setup_django(server.url)
        for scenario, name in SCENARIOS.items():
            if args.only not in (None, scenario):
                continue
            concurrency = getattr(args, f"concurrency_{scenario}")
            print(f"{scenario} ({name}), {args.jobs} jobs, {args.workers} workers x "
                  f"{concurrency}:")  # fmt: skip
            for pair in range(args.pairs):
                rates = {}
                for pool in ("thread", "async"):
                    rate, cpu, server_cpu = pools.drain(
                        server.url, pool, args.jobs, args.workers, concurrency,
                        server.proc.pid, name=name,
                    )  # fmt: skip
                    rates[pool] = rate
                    print(f"  pair {pair + 1} {pool:6} {rate:8.0f} jobs/s; CPU per job: "
                          f"workers {cpu:5.0f} µs, redis-server {server_cpu:4.0f} µs")  # fmt: skip
                print(f"  pair {pair + 1} async/thread: {rates['async'] / rates['thread']:.2f}x")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
