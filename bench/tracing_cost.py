"""What tracing costs a plain drain (docs/howto/tracing.md): one worker in
this process drains ``N`` plain jobs, added before the clock starts, on a
private redis-server; rounds alternate the modes so drift in a shared
machine's load spreads over all of them.

Modes: ``off`` (OpenTelemetry installed, no tracer provider: the default),
``on`` (an SDK provider whose exporter drops every span: the spans' own
cost, without a collector). Run from a checkout without ``tracing/`` (the
code before it), only ``off`` exists: that is the "not there at all" figure.

    python -m bench.tracing_cost --jobs 20000 --rounds 3 --modes off on

Besides the drain rate it prints the redis-server's CPU per 1,000 jobs
(``INFO cpu``): the Redis side of the drain (the per-minute counters'
cost), which other processes on a shared machine hardly move.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from bench.procs import setup_django

JOB = "bench.tracing_noop"


class Dropping:
    """An exporter that drops every span (the SDK's interface)."""

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def set_mode(mode: str) -> None:
    from opentelemetry import trace

    if mode == "off":
        trace._TRACER_PROVIDER = None  # the default: nothing configured
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    trace._TRACER_PROVIDER = provider


def redis_cpu_s(client) -> float:
    """CPU seconds the redis-server has used (user + system): the Redis side
    of a drain, which another process's load on a shared machine hardly moves."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain_s(url: str, n: int, concurrency: int) -> tuple[float, float]:
    """Seconds for one burst worker to drain ``n`` jobs added beforehand,
    and the redis-server's CPU seconds in that drain."""
    from echomq_django import EchoMQ, Worker

    client = redis.Redis.from_url(url)
    client.flushall()
    mq = EchoMQ(client, prefix="bt")
    for start in range(0, n, 1000):
        mq.enqueue_many("q", [(JOB, i) for i in range(start, min(n, start + 1000))])
    worker = Worker(["q"], concurrency=concurrency, mq=mq, register=False)
    cpu, started = redis_cpu_s(client), time.perf_counter()
    done = worker.run(burst=True)
    elapsed = time.perf_counter() - started
    assert done == n, (done, n)
    return elapsed, redis_cpu_s(client) - cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--modes", nargs="+", default=["off", "on"], choices=["off", "on"])
    args = p.parse_args(argv)
    from echomq_django.testing.redis_server import start_server

    server = start_server()
    try:
        setup_django(server.url)
        from echomq_django import handler

        handler(JOB)(lambda job: job.payload)
        drain_s(server.url, 1000, args.concurrency)  # warm: scripts loaded
        times: dict[str, list[float]] = {m: [] for m in args.modes}
        cpus: dict[str, list[float]] = {m: [] for m in args.modes}
        for _ in range(args.rounds):
            for mode in args.modes:
                set_mode(mode)
                took, cpu = drain_s(server.url, args.jobs, args.concurrency)
                times[mode].append(took)
                cpus[mode].append(cpu)
        for mode, got in times.items():
            best = min(got)
            print(
                f"{mode}: {args.jobs / best:,.0f} jobs/s best of {args.rounds} "
                f"(median {args.jobs / statistics.median(got):,.0f}); "
                f"drains {', '.join(f'{t:.2f}' for t in got)} s; redis-server CPU "
                f"{1000 * 1000 * statistics.median(cpus[mode]) / args.jobs:.1f} ms per 1,000 jobs"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
