"""The latency scenario (docs/explanation/performance.md#latency-an-idle-worker):
how long a job waits for an idle worker,
ours and BullMQ's, in one run on one Redis server.

Ours runs through the real commands with their default settings: one
process runs ``runworker lat lat-kids`` and one ``runpump lat lat-kids
--no-mirror`` (the benchmark has no database for the mirror). BullMQ's
process runs a ``Worker`` per queue (its default concurrency, 1). Each
sample is sent only once the one before it was handled and the worker had
a few ms to go idle again, so every sample meets an idle worker.

Scenarios (every handler takes its start time first, then pushes its
latency onto a Redis list the benchmark waits on with BLPOP):

- ``enqueue``: ``enqueue`` / ``Queue.add`` -> the handler starts;
- ``flow_same``: a parent + 2 children on one queue added -> the parent's
  handler starts (both children ran in between);
- ``flow_cross``: the same with the children on another queue (ours: the
  pump delivers);
- ``delayed``: a job with ``delay_ms`` -> its handler starts, counted from
  its due time (added time + delay);
- ``retry``: a job whose first attempt raises, with a backoff -> the second
  attempt starts, counted from the raise + the backoff.

Also: the Redis commands per second of the idle worker alone, before any
job (ours' pump not started yet), from ``INFO commandstats``, over
``IDLE_S`` seconds (on one server; not counted on a Cluster).

``OurSide(url, cluster=True)`` runs ours on a Redis Cluster (``url`` one of
its nodes; the benchmark starts three masters): the cross-queue flow's
parent and children then sit on two slots, on two masters when the slots
fall apart. BullMQ's side runs on one server only.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import redis
from redis.cluster import RedisCluster

from . import procs

QUEUE, KIDS = "lat", "lat-kids"
RECORDS = "bench:lat"  # list: one JSON record per handled sample
DELAY_MS, BACKOFF_MS = 50, 50
SETTLE_S = 0.005  # between samples: the worker goes back to blocking
IDLE_S = 10.0
SCENARIOS = ("enqueue", "flow_same", "flow_cross", "delayed", "retry")
LABELS = {
    "enqueue": "enqueue -> handler starts",
    "flow_same": "parent + 2 children, same queue: add -> parent starts",
    "flow_cross": "parent + 2 children on another queue: add -> parent starts",
    "delayed": f"delayed job ({DELAY_MS} ms): due -> handler starts",
    "retry": f"failed job, backoff {BACKOFF_MS} ms: due -> retry starts",
}


def now_ns() -> int:
    return time.time_ns()


def record(client, payload: dict) -> None:
    """A handler's side: its latency from ``payload['t0']`` (ns), pushed
    for the benchmark. ``payload['retry']``: the first attempt records its
    due time (raise + backoff) and raises instead."""
    started = now_ns()
    if payload.get("retry"):
        key = f"bench:failed:{payload['s']}"
        due = client.get(key)
        if due is None:
            client.set(key, started + BACKOFF_MS * 1_000_000)
            raise RuntimeError("first attempt fails (benchmark)")
        t0 = int(due)
    else:
        t0 = payload["t0"]
    client.rpush(RECORDS, json.dumps({"s": payload["s"], "ns": started - t0}))


# -- processes ---------------------------------------------------------------


def _command(url: str, module: str, args: list[str], cluster: bool = False) -> None:
    """Run one of our management commands, defaults and all, in this process
    (``cluster``: ``url`` is a node of a Redis Cluster)."""
    import importlib
    import tempfile

    database = os.path.join(tempfile.mkdtemp(prefix="emq-bench-"), "db.sqlite3")
    procs.setup_django(url, apps=("echomq_django",), database=database, cluster=cluster)
    from django.core.management import call_command

    import bench.handlers  # noqa: F401  (registers the bench.* handlers)

    call_command("migrate", verbosity=0)  # the enqueue outbox's table, as a site has it
    command = importlib.import_module(f"echomq_django.management.commands.{module}").Command()
    call_command(command, *args)


async def _peer_main(url: str, ready) -> None:
    import asyncio

    from bullmq import Worker

    client = redis.Redis.from_url(url)

    async def process(job, token):
        if job.name == "lat":
            record(client, job.data)
        return 1

    workers = [Worker(q, process, {"connection": url, "autorun": False}) for q in (QUEUE, KIDS)]
    for w in workers:
        await w.backend.connection.conn.ping()
    tasks = [asyncio.ensure_future(w.run()) for w in workers]
    ready.put(os.getpid())
    await asyncio.gather(*tasks)


def _peer(url: str, ready) -> None:
    import asyncio
    import warnings

    warnings.simplefilter("ignore")
    asyncio.run(_peer_main(url, ready))


# -- the two sides -----------------------------------------------------------


class OurSide:
    name = "echomq"

    def __init__(self, url: str, cluster: bool = False) -> None:
        from echomq_django import EchoMQ

        self.url, self.cluster = url, cluster
        client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
        self.mq = EchoMQ(client, prefix=procs.PREFIX)
        self.layout = f"runworker {QUEUE} {KIDS}; runpump {QUEUE} {KIDS} --no-mirror (defaults)"
        if cluster:
            self.name, self.layout = "echomq (Cluster)", f"{self.layout}, a 3-master Cluster"

    def processes(self, ctx, ready) -> list:
        c = self.cluster
        return [
            ctx.Process(
                target=_ready_then,
                args=(ready, _command, self.url, "runworker", [QUEUE, KIDS], c),
            ),
            ctx.Process(
                target=_ready_then,
                args=(ready, _command, self.url, "runpump", [QUEUE, KIDS, "--no-mirror"], c),
            ),
        ]

    def send(self, kind: str, key: str) -> None:
        from echomq_django import Flow

        t0 = now_ns()
        data = {"s": key, "t0": t0}
        if kind == "enqueue":
            self.mq.enqueue(QUEUE, "bench.lat", data)
        elif kind in ("flow_same", "flow_cross"):
            q = QUEUE if kind == "flow_same" else KIDS
            kids = [Flow(q, "bench.one", {}), Flow(q, "bench.one", {})]
            self.mq.add_flow(Flow(QUEUE, "bench.lat", data, children=kids))
        elif kind == "delayed":
            data["t0"] = t0 + DELAY_MS * 1_000_000
            self.mq.enqueue(QUEUE, "bench.lat", data, delay_ms=DELAY_MS)
        else:
            data["retry"] = True
            self.mq.enqueue(QUEUE, "bench.lat", data, max_attempts=2, backoff_ms=BACKOFF_MS)

    def close(self) -> None:
        self.mq.client.close()


class PeerSide:
    name = "bullmq"

    def __init__(self, url: str) -> None:
        import asyncio
        import warnings

        from bullmq import FlowProducer, Queue

        warnings.simplefilter("ignore")
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.queue = Queue(QUEUE, {"connection": url})
        self.producer = FlowProducer({"connection": url})
        self.layout = f"one process, a Worker on {QUEUE} and one on {KIDS} (defaults)"

    def processes(self, ctx, ready) -> list:
        return [ctx.Process(target=_peer, args=(self.url, ready))]

    def send(self, kind: str, key: str) -> None:
        t0 = now_ns()
        data = {"s": key, "t0": t0}
        run = self.loop.run_until_complete
        if kind == "enqueue":
            run(self.queue.add("lat", data))
        elif kind in ("flow_same", "flow_cross"):
            q = QUEUE if kind == "flow_same" else KIDS
            kids = [{"name": "one", "queueName": q, "data": {}} for _ in range(2)]
            run(
                self.producer.add(
                    {"name": "lat", "queueName": QUEUE, "data": data, "children": kids}
                )
            )
        elif kind == "delayed":
            data["t0"] = t0 + DELAY_MS * 1_000_000
            run(self.queue.add("lat", data, {"delay": DELAY_MS}))
        else:
            data["retry"] = True
            opts = {"attempts": 2, "backoff": {"type": "fixed", "delay": BACKOFF_MS}}
            run(self.queue.add("lat", data, opts))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.queue.close())
            self.loop.run_until_complete(self.producer.close())
        finally:
            self.loop.close()


def _ready_then(ready, target, *args) -> None:
    ready.put(os.getpid())
    target(*args)


# -- measuring ---------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def measure(
    side, client: redis.Redis, kind: str, samples: int, tag: str = "m", timeout: float = 10.0
) -> list:
    """``samples`` latencies (ms) of ``kind``, one sample at a time; ``tag``
    keeps the sample keys of a warm-up apart."""
    out = []
    for i in range(samples):
        key = f"{kind}-{tag}-{i}"
        side.send(kind, key)
        deadline, got = time.monotonic() + timeout, None
        while got is None and time.monotonic() < deadline:
            got = client.blpop([RECORDS], timeout=1)  # under the socket timeout
        if got is None:
            raise RuntimeError(f"{side.name} {kind}: sample {i} was not handled in {timeout} s")
        rec = json.loads(got[1])
        if rec["s"] != key:
            raise RuntimeError(f"{side.name} {kind}: got sample {rec['s']}, expected {key}")
        out.append(rec["ns"] / 1e6)
        time.sleep(SETTLE_S)
    return out


def idle_commands(client: redis.Redis, seconds: float = IDLE_S) -> tuple[float, dict]:
    """Redis commands per second while nothing is sent (those run inside
    scripts included), less this probe's own INFO calls; and the count of
    each command over the ``seconds``."""

    def calls() -> dict:
        info = client.info("commandstats")
        return {k[8:]: v["calls"] for k, v in info.items() if k != "cmdstat_info"}

    before = calls()
    time.sleep(seconds)
    after = calls()
    each = {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0)}
    return sum(each.values()) / seconds, each


def run_side(side, url: str, samples: int, idle_s: float = IDLE_S, progress=None) -> dict:
    """On a flushed server: start ``side``'s worker process alone and count
    its idle Redis commands; then start the rest (ours: the pump), measure
    every scenario, and stop the processes."""
    ctx = multiprocessing.get_context("spawn")
    cluster = getattr(side, "cluster", False)
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    client.flushall()  # on a Cluster: every master
    ready = ctx.Queue()
    processes = side.processes(ctx, ready)
    try:
        processes[0].start()
        ready.get(timeout=120)
        time.sleep(3.0)  # connected, blocking, its first timers run
        if progress:
            progress(f"{side.name} latency: idle commands over {idle_s:g} s")
        row = {"system": side.name, "layout": side.layout, "samples": samples}
        row["idle_cmds_per_s"], row["idle_commands"] = (
            (None, {}) if cluster else idle_commands(client, idle_s)
        )
        for p in processes[1:]:
            p.start()
            ready.get(timeout=120)
        time.sleep(1.0)
        for kind in SCENARIOS:  # warm: scripts loaded, paths taken once
            measure(side, client, kind, min(3, samples), tag="warm")
        for kind in SCENARIOS:
            if progress:
                progress(f"{side.name} latency: {kind}, {samples} samples")
            values = measure(side, client, kind, samples)
            row[kind] = {
                "p50": percentile(values, 50),
                "p90": percentile(values, 90),
                "p99": percentile(values, 99),
                "max": max(values),
            }
        return row
    finally:
        for p in processes:
            if p.pid is not None:
                _stop(p)
        client.flushall()
        client.close()


def _stop(process) -> None:
    """SIGTERM (our commands stop gracefully), SIGKILL after 10 s."""
    if process.is_alive():
        os.kill(process.pid, signal.SIGTERM)
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join()


def format_rows(rows: list[dict]) -> str:
    """The latency table (markdown): p50 / p90 / p99 ms per scenario and system."""
    systems = [r["system"] for r in rows]
    head = "| from -> to | " + " | ".join(f"{s} p50 / p90 / p99 ms" for s in systems) + " |"
    lines = [head, "|---|" + "--:|" * len(rows)]
    for kind in SCENARIOS:
        cells = [
            f"{r[kind]['p50']:.2f} / {r[kind]['p90']:.2f} / {r[kind]['p99']:.2f}" for r in rows
        ]
        lines.append(f"| {LABELS[kind]} | " + " | ".join(cells) + " |")
    idle = ["-" if r["idle_cmds_per_s"] is None else f"{r['idle_cmds_per_s']:.2f}" for r in rows]
    lines.append(
        "| idle worker on 2 queues: Redis commands per second | " + " | ".join(idle) + " |"
    )
    return "\n".join(lines)
