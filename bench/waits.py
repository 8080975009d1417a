"""The wait scenario (docs/explanation/performance.md#waiting-for-a-result):
how soon a caller that waits for a job's result has it, ours and BullMQ's
(Node, ``job.waitUntilFinished``) in one run on one Redis server.

- ``round trip``: ``enqueue`` then ``emq.wait`` returns, for a handler that
  returns at once on an idle worker (ours: ``runworker`` with its defaults;
  BullMQ: a ``Worker`` with its defaults, ``queue.add`` then
  ``job.waitUntilFinished(queueEvents)``), one sample at a time, 5 ms
  apart, ours and BullMQ's in turn (both workers up the whole time);
  p50 / p90 / p99 ms.
- ``waiters``: N jobs added with no worker running, N waiters blocked on
  them at once (ours: N threads calling ``emq.wait``, in one process or
  spread over ``--waiter-processes``;
  BullMQ: N ``waitUntilFinished`` on one ``QueueEvents``), the Redis
  commands per second while they all wait (``INFO commandstats``), then a
  worker drains the jobs; each waiter's wake delay is its wake time minus
  its job's finish time (the row's ``finished_at`` / BullMQ's
  ``finishedOn``, ms, by the worker's clock on the same host); p50 / p90 /
  p99 ms.

BullMQ's side needs Node and ``npm install --prefix bench/node``
(``bench/node/package.json``); without them ours runs alone.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import threading
import time
from pathlib import Path

import redis

from . import procs
from .latency import _command, _ready_then, _stop, percentile

QUEUE = "wq"
NODE_DIR = Path(__file__).resolve().parent / "node"
SETTLE_S = 0.005  # between round-trip samples: the worker goes back to blocking
WARM = 5  # round trips before the measured ones (scripts loaded, paths taken)
IDLE_WINDOW_S = 2.0  # how long the blocked waiters' Redis commands are counted
WAIT_S = 120.0  # every wait's timeout (s): none is reached


def node_bullmq() -> str | None:
    """BullMQ's version under ``bench/node``, or None (no node, not installed)."""
    package = NODE_DIR / "node_modules" / "bullmq" / "package.json"
    if not shutil.which("node") or not package.is_file():
        return None
    return json.loads(package.read_text())["version"]


def stats(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def _commands(client) -> int:
    info = client.info("commandstats")
    return sum(v["calls"] for k, v in info.items() if k != "cmdstat_info")


def _our_worker(url: str):
    """A ``runworker wq`` process, started and given time to block."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    process = ctx.Process(target=_ready_then, args=(ready, _command, url, "runworker", [QUEUE]))
    process.start()
    ready.get(timeout=120)
    time.sleep(2.0)  # Django set up, connected, blocking on its wake key
    return process


def ours_round_trip(url: str, samples: int) -> list[float]:
    """``samples`` enqueue -> ``wait`` round trips (ms) on an idle worker."""
    from echomq_django import EchoMQ

    client = redis.Redis.from_url(url)
    client.flushall()
    mq = EchoMQ(client, prefix=procs.PREFIX)
    worker = _our_worker(url)
    try:
        out = []
        for i in range(WARM + samples):
            t0 = time.perf_counter()
            job_id = mq.enqueue(QUEUE, "bench.one", None)
            mq.wait(QUEUE, job_id, WAIT_S)
            if i >= WARM:
                out.append((time.perf_counter() - t0) * 1000)
            time.sleep(SETTLE_S)
        return out
    finally:
        _stop(worker)
        client.flushall()
        client.close()


def _waiting(url: str, ids: list[str], results) -> None:
    """A waiter process: one thread per id blocks in ``emq.wait``; puts
    ``{id: wake time (ns since the epoch)}`` on ``results`` once all woke."""
    from echomq_django import EchoMQ

    mq = EchoMQ(redis.Redis.from_url(url, max_connections=len(ids) + 10), prefix=procs.PREFIX)
    woke: dict[str, int] = {}

    def wait(job_id: str) -> None:
        mq.wait(QUEUE, job_id, WAIT_S)
        woke[job_id] = time.time_ns()

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    results.put(woke)


def ours_waiters(url: str, n: int, processes: int = 1) -> dict:
    """``n`` waiters (threads, over ``processes`` processes) on ``n`` jobs:
    the Redis commands/s while they all block, and their wake delays (ms)."""
    from echomq_django import EchoMQ

    client = redis.Redis.from_url(url)
    client.flushall()
    mq = EchoMQ(client, prefix=procs.PREFIX)
    ids = mq.enqueue_many(QUEUE, [{"name": "bench.one"} for _ in range(n)])
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    share = [ids[p::processes] for p in range(processes)]
    waiters = [ctx.Process(target=_waiting, args=(url, part, results)) for part in share]
    for process in waiters:
        process.start()
    deadline = time.monotonic() + 120
    while client.info("clients")["blocked_clients"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError("the waiters did not all block in 120 s")
        time.sleep(0.05)  # setup only: the waiters register and block
    before = _commands(client)
    time.sleep(IDLE_WINDOW_S)
    idle = (_commands(client) - before) / IDLE_WINDOW_S  # INFO is not counted
    worker = _our_worker(url)
    try:
        woke: dict[str, int] = {}
        for _ in waiters:
            woke.update(results.get(timeout=WAIT_S))
        if len(woke) < n:
            raise RuntimeError(f"{n - len(woke)} waiters did not wake")
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(mq.keys.job(QUEUE, job_id), "finished_at")
        finished = [int(v) for v in pipe.execute()]
    finally:
        _stop(worker)
        for process in waiters:
            process.join(10)
        client.flushall()
        client.close()
    delays = [woke[i] / 1e6 - f for i, f in zip(ids, finished, strict=True)]
    return {"idle_cmds_per_s": idle, "processes": processes, "wake_delay_ms": stats(delays)}


def _node(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        ["node", str(NODE_DIR / "wait.mjs"), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=NODE_DIR,
        **kwargs,
    )


def _node_worker(url: str) -> subprocess.Popen:
    worker = _node("worker", url, QUEUE)
    if worker.stdout.readline().strip() != "ready":
        raise RuntimeError("BullMQ's worker did not start")
    time.sleep(1.0)
    return worker


def _end(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def bullmq_waiters(url: str, n: int) -> dict:
    """BullMQ's ``n`` waiters on one ``QueueEvents``: idle commands/s, wake delays (ms)."""
    client = redis.Redis.from_url(url)
    client.flushall()
    waiters = _node("waiters", url, QUEUE, str(n))
    worker = None
    try:
        if waiters.stdout.readline().strip() != "waiting":
            raise RuntimeError("BullMQ's waiters did not start")
        time.sleep(0.5)
        before = _commands(client)
        time.sleep(IDLE_WINDOW_S)
        idle = (_commands(client) - before) / IDLE_WINDOW_S
        worker = _node_worker(url)
        out, _ = waiters.communicate(timeout=WAIT_S)
        delays = json.loads(out.strip().splitlines()[-1])["delay_ms"]
    finally:
        if worker:
            _end(worker)
        if waiters.poll() is None:
            _end(waiters)
        client.flushall()
        client.close()
    return {"idle_cmds_per_s": idle, "wake_delay_ms": stats(delays)}


def interleaved_round_trips(url: str, samples: int) -> dict[str, list[float]]:
    """Ours and BullMQ's round trips (ms) taken in turn, one of each per
    step, both workers idle and running the whole time: a busy moment of a
    shared machine falls on both sides alike."""
    from echomq_django import EchoMQ

    client = redis.Redis.from_url(url)
    client.flushall()
    mq = EchoMQ(client, prefix=procs.PREFIX)
    ours_worker, node_worker = _our_worker(url), _node_worker(url)
    serve = _node("serve", url, QUEUE, stdin=subprocess.PIPE)
    try:
        if serve.stdout.readline().strip() != "ready":
            raise RuntimeError("BullMQ's waiter did not start")

        def theirs() -> float:
            serve.stdin.write("go\n")
            serve.stdin.flush()
            return float(serve.stdout.readline())

        def ours() -> float:
            t0 = time.perf_counter()
            mq.wait(QUEUE, mq.enqueue(QUEUE, "bench.one", None), WAIT_S)
            return (time.perf_counter() - t0) * 1000

        out: dict[str, list[float]] = {"echomq": [], "bullmq": []}
        for i in range(WARM + samples):
            for name, one in (("echomq", ours), ("bullmq", theirs)):
                ms = one()
                if i >= WARM:
                    out[name].append(ms)
                time.sleep(SETTLE_S)
        return out
    finally:
        if serve.poll() is None:
            _end(serve)
        _end(node_worker)
        _stop(ours_worker)
        client.flushall()
        client.close()


def run(
    url: str, samples: int, waiters: int, with_peer: bool, processes: int = 1, progress=None
) -> list[dict]:
    """The round trips (interleaved with BullMQ's when ``with_peer``), then
    ours' waiters (over ``processes`` processes) and BullMQ's: one row per system."""
    if progress:
        progress(f"wait: {samples} round trips")
    if with_peer:
        trips = interleaved_round_trips(url, samples)
    else:
        trips = {"echomq": ours_round_trip(url, samples)}
    rows = []
    for name, wait_many in (("echomq", ours_waiters), ("bullmq", bullmq_waiters)):
        if name not in trips:
            continue
        if progress:
            progress(f"{name} wait: {waiters} waiters")
        row = {"system": name, "round_trip_ms": stats(trips[name]), "waiters": waiters}
        row.update(
            wait_many(url, waiters, processes) if name == "echomq" else wait_many(url, waiters)
        )
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    """The wait table (markdown), and the targets against BullMQ when it ran."""
    head = "| measure | " + " | ".join(r["system"] for r in rows) + " |"
    lines = [head, "|---|" + "--:|" * len(rows)]

    def cells(get) -> str:
        return " | ".join(get(r) for r in rows)

    lines.append(
        "| enqueue -> wait() returns, p50 / p90 / p99 ms | "
        + cells(lambda r: "{p50:.2f} / {p90:.2f} / {p99:.2f}".format(**r["round_trip_ms"]))
        + " |"
    )
    lines.append(
        f"| {rows[0]['waiters']:,} waiters blocked (ours in {rows[0]['processes']} "
        "process(es), BullMQ in one): Redis commands/s | "
        + cells(lambda r: f"{r['idle_cmds_per_s']:.1f}")
        + " |"
    )
    lines.append(
        "| wake delay after the finish, p50 / p90 / p99 ms | "
        + cells(lambda r: "{p50:.2f} / {p90:.2f} / {p99:.2f}".format(**r["wake_delay_ms"]))
        + " |"
    )
    ours = rows[0]
    verdict = [
        f"target p99 <= 20 ms: {ours['round_trip_ms']['p99']:.2f} ms "
        + ("met" if ours["round_trip_ms"]["p99"] <= 20 else "MISSED"),
        f"target waiter wake p90 <= 5 ms: {ours['wake_delay_ms']['p90']:.2f} ms "
        + ("met" if ours["wake_delay_ms"]["p90"] <= 5 else "MISSED"),
    ]
    if len(rows) > 1:
        ratio = ours["round_trip_ms"]["p50"] / rows[1]["round_trip_ms"]["p50"]
        verdict.insert(
            0,
            f"target p50 within 1.5x BullMQ: {ratio:.2f}x " + ("met" if ratio <= 1.5 else "MISSED"),
        )
    return "\n".join([*lines, "", *verdict])
