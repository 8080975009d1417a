"""``python -m bench.restart``: how late a delayed job starts when its worker
was restarted before it came due (target: within 100 ms of its due time, p90
over ``--restarts`` restarts; docs/explanation/performance.md#restart-latency).

Each restart, on a private redis-server (or ``--redis-url``):

1. worker A (``runworker rst``, the real command, default settings) is idle;
2. a job is added with a delay: its due time is the restart's start plus
   the time a new worker took to come up at the warm-up restart plus
   ``--due-after`` seconds (1 s), so it falls due about 1 s after the new
   worker is up. A learns its run-at (the queue's ``'d'`` wake marker);
3. A gets SIGTERM and exits (handing that marker back); worker B (a fresh
   ``runworker rst`` process) starts, and is up once it is listed among the
   live workers;
4. the job's handler records when it started; the sample is that minus the
   due time (ms). B becomes A for the next restart.

A sample whose new worker came up after the job's due time is not counted
(it measures start-up, not the hand-over) and is reported as ``late start``.
The BullMQ column is n/a unless its Python client is installed and
``--peer`` is given; this scenario has no BullMQ side yet (its restart path,
a delayed job picked up by a new worker's first marker read, is comparable,
so it is left for when the client is available).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time

import redis

from . import procs
from .latency import RECORDS, _command, _ready_then, _stop, now_ns, percentile

QUEUE = "rst"
TARGET_MS = 100.0


def _worker(ctx, url: str):
    ready = ctx.Queue()
    process = ctx.Process(target=_ready_then, args=(ready, _command, url, "runworker", [QUEUE]))
    process.start()
    ready.get(timeout=120)
    return process


def _wait_live(mq, pid: int, timeout: float = 120.0) -> float:
    """Wait until worker ``pid`` is listed among the live processes (its
    heartbeat is written as its loop starts); returns that time (ns)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.pid == pid and p.kind == "worker" for p in mq.presence.live_processes()):
            return now_ns()
        time.sleep(0.005)  # a harness waiting on a process start, not the measured path
    raise RuntimeError(f"worker {pid} did not come up in {timeout} s")


def _restart(ctx, url: str, mq, client, old, key: str, lead_s: float, due_after_s: float):
    """One restart; returns ``(sample ms or None when late, up_s, the new worker)``."""
    start = now_ns()
    delay_ms = int((lead_s + due_after_s) * 1000)
    due_ns = start + delay_ms * 1_000_000
    mq.enqueue(QUEUE, "bench.lat", {"s": key, "t0": due_ns}, delay_ms=delay_ms)
    time.sleep(0.05)  # A pops the 'd' marker (it is idle, blocked on the wake key)
    _stop(old)
    new = _worker(ctx, url)
    up_ns = _wait_live(mq, new.pid)
    got = None
    deadline = time.monotonic() + lead_s + due_after_s + 30
    while got is None and time.monotonic() < deadline:
        got = client.blpop([RECORDS], timeout=1)
    if got is None:
        raise RuntimeError(f"restart {key}: the delayed job never ran")
    rec = json.loads(got[1])
    late = up_ns > due_ns
    return (None if late else rec["ns"] / 1e6), (up_ns - start) / 1e9, new


def run(url: str, restarts: int, due_after_s: float, progress=print) -> dict:
    """Warm up (one restart, to time a worker's start), then ``restarts``
    restarts; returns the figures (ms)."""
    procs.setup_django(url, apps=("echomq_django",))
    import bench.handlers  # noqa: F401  (registers bench.lat for the record)

    mq = procs._mq(url)
    client = redis.Redis.from_url(url)
    client.flushall()
    ctx = multiprocessing.get_context("spawn")
    worker = _worker(ctx, url)
    try:
        _wait_live(mq, worker.pid)
        _, up_s, worker = _restart(ctx, url, mq, client, worker, "warm", 3.0, due_after_s)
        lead_s = up_s * 1.5 + 0.5  # a slower start than the warm-up's still comes up in time
        samples, late, ups = [], 0, []
        for i in range(restarts):
            progress(f"restart {i + 1}/{restarts} (a new worker takes ~{up_s:.1f} s to start)")
            ms, up, worker = _restart(ctx, url, mq, client, worker, f"r{i}", lead_s, due_after_s)
            ups.append(up)
            if ms is None:
                late += 1
            else:
                samples.append(ms)
        return {
            "restarts": restarts,
            "counted": len(samples),
            "late_start": late,
            "p50_ms": percentile(samples, 50) if samples else None,
            "p90_ms": percentile(samples, 90) if samples else None,
            "max_ms": max(samples) if samples else None,
            "worker_start_s_p50": percentile(ups, 50) if ups else None,
            "target_ms": TARGET_MS,
            "bullmq": "n/a",
        }
    finally:
        _stop(worker)
        client.flushall()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.restart",
        description="A delayed job due about 1 s after its worker was restarted: how late "
        "it starts on the new worker (p50/p90 ms over N restarts; target p90 <= 100 ms).",
    )
    parser.add_argument("--redis-url", help="use this Redis (FLUSHALLed!) instead of a private one")
    parser.add_argument("--restarts", type=int, default=20, help="restarts measured (default 20)")
    parser.add_argument(
        "--due-after",
        type=float,
        default=1.0,
        help="seconds between the new worker coming up and the job's due time (default 1.0)",
    )
    parser.add_argument("--json", dest="json_path", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.restarts < 1:
        parser.error("--restarts must be >= 1")
    server = None
    url = args.redis_url
    if url is None:
        from echomq_django.testing.redis_server import start_server

        server = start_server()
        url = server.url
    os.environ["ECHOMQ_URL"] = url
    try:
        result = run(url, args.restarts, args.due_after)
    finally:
        if server is not None:
            server.stop()
    print(f"restart latency: runworker {QUEUE} restarted {result['restarts']} times")
    print(
        "| delayed job due ~1 s after a worker restart: due -> handler starts | echomq | bullmq |"
    )
    print("|---|--:|--:|")
    for name in ("p50_ms", "p90_ms", "max_ms"):
        value = result[name]
        cell = "n/a" if value is None else f"{value:.1f}"
        print(f"| {name.replace('_ms', '')} (ms) | {cell} | n/a |")
    print(
        f"counted {result['counted']} of {result['restarts']} "
        f"(late start: {result['late_start']}); "
        f"a new worker came up in {result['worker_start_s_p50']:.2f} s (p50)"
    )
    met = result["p90_ms"] is not None and result["p90_ms"] <= TARGET_MS
    print(f"target p90 <= {TARGET_MS:.0f} ms: {'met' if met else 'NOT met'}")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
