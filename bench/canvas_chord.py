"""``python -m bench.canvas_chord``: what the canvas costs over a flow
written by hand (the target: compiling and adding a chord of 10,000
signatures at most 1.2x adding the equivalent ``Flow``;
docs/explanation/canvas.md#cost).

One private redis-server. "by hand" builds ``Flow(root, children=[10,000
leaves])`` and adds it; "canvas" builds 10,000 ``task()`` signatures (each
checked: its handler registered, its payload JSON), the chord over them,
and ``enqueue``\\ s it. Both on one queue (one atomic add, in chunks); Redis
is flushed before each add. Rounds alternate; the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from echomq_django.testing.redis_server import start_server

from .soak import setup_django

Q = "wide"


def _by_hand(mq, n: int) -> None:
    from echomq_django import Flow

    mq.add_flow(Flow(Q, "bench.root", {}, children=[
        Flow(Q, "bench.leaf", {"i": i}) for i in range(n)]))  # fmt: skip


def _canvas(mq, n: int) -> None:
    import echomq_django as emq

    members = [emq.task("bench.leaf", queue=Q, i=i) for i in range(n)]
    emq.chord(members, emq.task("bench.root", queue=Q)).enqueue(mq=mq)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.canvas_chord", description=__doc__)
    p.add_argument("--members", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=7, help="rounds of each (default 7)")
    args = p.parse_args(argv)
    server = start_server()
    try:
        setup_django(server.url, ":memory:")
        import bench.handlers  # noqa: F401  (bench.root / bench.leaf)
        from echomq_django import EchoMQ

        mq = EchoMQ(redis.Redis.from_url(server.url))
        times: dict = {"by hand": [], "canvas": []}
        cpu: dict = {"by hand": [], "canvas": []}  # this process's CPU: Redis' work is the same
        for _ in range(args.rounds):
            for name, add in (("by hand", _by_hand), ("canvas", _canvas)):
                mq.client.flushall()
                started, cpu0 = time.perf_counter(), time.process_time()
                add(mq, args.members)
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu0)
                assert mq.dependency_counts(Q, mq.job_ids(Q, "awaiting_children")[0])[
                    "children"] == args.members  # fmt: skip
        for name, got in times.items():
            mid = statistics.median(got)
            print(f"{name}: min {min(got) * 1000:.1f} ms, median {mid * 1000:.1f} ms")
        hand, canvas = statistics.median(times["by hand"]), statistics.median(times["canvas"])
        pairs = sorted(b / a for a, b in zip(times["by hand"], times["canvas"], strict=True))
        print(f"chord of {args.members:,}: by hand {hand * 1000:.1f} ms, canvas "
              f"{canvas * 1000:.1f} ms (medians of {args.rounds}): canvas/by hand "
              f"{canvas / hand:.3f} (target <= 1.2)")  # fmt: skip
        print(f"min against min: {min(times['canvas']) / min(times['by hand']):.3f}")
        hand_cpu, canvas_cpu = statistics.median(cpu["by hand"]), statistics.median(cpu["canvas"])
        print(f"client CPU (median): by hand {hand_cpu * 1000:.1f} ms, canvas "
              f"{canvas_cpu * 1000:.1f} ms: {canvas_cpu / hand_cpu:.3f}")  # fmt: skip
        print(f"pair by pair: median {statistics.median(pairs):.3f} "
              f"(min {pairs[0]:.3f}, max {pairs[-1]:.3f})")  # fmt: skip
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
