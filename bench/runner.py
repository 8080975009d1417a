"""One measured run: a topology through one system (ours or the peer).

    FLUSHALL, warm-up (scripts loaded, a small flow of the same shape), FLUSHALL
    start the worker (and pump) processes; wait until each is connected
    snapshot INFO  ->  add (timed)  ->  snapshot INFO (memory per node)
    set go (the clock starts)  ->  poll the root every 2 ms  ->  snapshot INFO
    stop the processes, check every parent received its children's values

Memory per node is the ``used_memory`` delta across the add, less the
delta of the clients' buffers (``mem_clients_normal``: the adder's query
buffer is not data), divided by the nodes; each snapshot waits for a pass
of Redis' client cron, which is when it updates ``mem_clients_normal``.
Round trips are counted by the server: ``total_writes_processed`` (one
write per reply batch, so a pipeline or a script is one) minus the probe's
own. Redis commands count every
command run, those inside scripts included (``INFO commandstats``); script
time is the ``usec`` of EVALSHA/EVAL/EXEC; Redis CPU is ``used_cpu_user`` +
``used_cpu_sys``; worker CPU is each worker process' own CPU time from
``go`` to ``stop``.
"""

from __future__ import annotations

import multiprocessing
import queue as _queue
import sys
import time
from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from .topologies import Topology

POLL_S = 0.002
PROGRESS_S = 0.25
READY_TIMEOUT_S = 120
# Redis updates its clients' memory figure (mem_clients_normal) in its 100 ms
# cron, not when INFO asks: wait for a pass before each memory snapshot
SETTLE_S = 0.3


@dataclass
class Layout:
    procs: int
    concurrency: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"2x50"``: 2 processes with concurrency 50 each."""
        try:
            procs, conc = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ValueError(
                f"a worker layout is PROCSxCONCURRENCY, e.g. 2x50; got {text!r}"
            ) from None
        if procs < 1 or conc < 1:
            raise ValueError(f"a worker layout needs >= 1 process and concurrency; got {text!r}")
        return cls(procs, conc)

    def __str__(self) -> str:
        return f"{self.procs}x{self.concurrency}"


@dataclass
class Snapshot:
    memory: int  # used_memory minus the clients' buffers (mem_clients_normal)
    clients: int
    writes: int
    commands: int
    evals: int
    eval_usec: int
    cpu: float

    @classmethod
    def take(cls, client: redis.Redis) -> Snapshot:
        """The server's figures (on a Cluster: every master's, summed)."""
        if isinstance(client, RedisCluster):
            return cls.summed(client.info("all", target_nodes=RedisCluster.PRIMARIES).values())
        return cls.of(client.info("all"))

    @classmethod
    def summed(cls, infos) -> Snapshot:
        snaps = [cls.of(info) for info in infos]
        return cls(*(sum(getattr(s, f) for s in snaps) for f in cls.__dataclass_fields__))

    @classmethod
    def of(cls, info: dict) -> Snapshot:
        calls = evals = eval_usec = 0
        for key, value in info.items():
            if not key.startswith("cmdstat_") or key == "cmdstat_info":
                continue
            calls += value["calls"]  # commands run inside scripts included
            if key in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_exec"):
                evals += value["calls"]
                eval_usec += value["usec"]
        clients = info.get("mem_clients_normal", 0)
        return cls(
            info["used_memory"] - clients,
            clients,
            info["total_writes_processed"],
            calls,
            evals,
            eval_usec,
            info["used_cpu_sys"] + info["used_cpu_user"],
        )


class Probe:
    """The main process' connection: flushes, snapshots and polls; counts
    the round trips and commands it sends so they are subtracted (on a
    Cluster, ``cluster``: one trip per master a snapshot or pipeline asks)."""

    def __init__(self, url: str, cluster: bool = False) -> None:
        self.client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
        self.cluster = cluster
        self.trips = 0
        self.commands = 0

    def flush(self) -> None:
        # SYNC: a server that frees lazily (Valkey 8's lazyfree-lazy-user-flush) would free the
        # flushed keys while a run's memory is measured, and a node could weigh less than 0
        self.client.execute_command("FLUSHALL", "SYNC")  # on a Cluster: every master

    def snapshot(self) -> Snapshot:
        snap = Snapshot.take(self.client)
        self.trips += len(self.client.get_primaries()) if self.cluster else 1
        return snap

    def pipeline(self, build) -> list:
        pipe = self.client.pipeline(transaction=False)
        build(pipe)
        n = len(pipe.command_stack)
        if self.cluster:
            slots = {self.client.keyslot(c.args[1]) for c in pipe.command_stack}
            nodes = {self.client.nodes_manager.get_node_from_slot(s).name for s in slots}
        replies = pipe.execute()
        self.trips += len(nodes) if self.cluster else 1
        self.commands += n
        return replies


class Progress:
    """A carriage-return progress line on stderr (only on a terminal)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.width = 0

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r" + text.ljust(self.width))
            sys.stderr.flush()
            self.width = len(text)

    def clear(self) -> None:
        if self.enabled and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
            self.width = 0


def run_one(system, topo: Topology, probe: Probe, progress: Progress, timeout: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    spec = topo.spec()
    progress.show(f"{system.name} {topo.label}: warming up")
    probe.flush()
    system.warm_up(topo)
    probe.flush()

    ready, results = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    processes = system.processes(ctx, topo, ready, go, stop, results)
    row = {
        "system": system.name,
        "topology": topo.key,
        "label": topo.label,
        "nodes": topo.nodes,
        "layout": system.describe_layout(topo),
    }
    try:
        progress.show(f"{system.name} {topo.label}: starting {len(processes)} processes")
        for p in processes:
            p.start()
        for _ in processes:
            ready.get(timeout=READY_TIMEOUT_S)

        description = system.build(spec)
        system.fresh_connection()
        progress.show(f"{system.name} {topo.label}: adding {topo.nodes:,} nodes")
        time.sleep(SETTLE_S)
        trips0, cmds0 = probe.trips, probe.commands
        s0 = probe.snapshot()
        started = time.perf_counter()
        handle = system.add(description)
        add_s = time.perf_counter() - started
        time.sleep(SETTLE_S)
        s1 = probe.snapshot()
        trips1, cmds1 = probe.trips, probe.commands

        go.set()
        t0 = time.perf_counter()
        go_ms = time.time() * 1000
        state, shown = None, 0.0
        deadline = t0 + timeout
        while True:
            replies = probe.pipeline(lambda pipe: system.done_probe(pipe, handle))
            state = system.done_state(*replies)
            now = time.perf_counter()
            if state or now > deadline:
                break
            if now - shown >= PROGRESS_S:
                shown = now
                done = sum(probe.pipeline(lambda pipe: system.progress_probe(pipe, topo)))
                progress.show(
                    f"{system.name} {topo.label}: {done:,}/{topo.nodes:,} nodes "
                    f"completed, {now - t0:.1f} s"
                )
            time.sleep(POLL_S)
        resolve_s = time.perf_counter() - t0
        trips2, cmds2 = probe.trips, probe.commands
        s2 = probe.snapshot()
    finally:
        stop.set()
        stats = []
        end = time.monotonic() + 60
        for _ in processes:
            try:
                stats.append(results.get(timeout=max(0.1, end - time.monotonic())))
            except _queue.Empty:
                break
        for p in processes:
            p.join(timeout=max(0.1, end - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)
        progress.clear()

    n = topo.nodes
    add_trips = s1.writes - s0.writes - (trips1 - trips0)
    res_trips = s2.writes - s1.writes - (trips2 - trips1)
    add_cmds = s1.commands - s0.commands - (cmds1 - cmds0)
    res_cmds = s2.commands - s1.commands - (cmds2 - cmds1)
    check = (
        system.check(handle, spec)
        if state == "completed"
        else {
            "ok": False,
            "values": 0,
            "problems": [f"root {state or 'not finished'} after {resolve_s:.1f} s"],
        }
    )
    worker_cpu = sum(s["cpu_s"] for s in stats if s["role"] != "pump")
    timeline = _timeline(system.times(handle), go_ms) if state == "completed" else None
    row.update(
        {
            "add_ms": round(add_s * 1000, 2),
            "add_nodes_per_s": round(n / add_s),
            "resolve_s": round(resolve_s, 4) if state == "completed" else None,
            "resolve_nodes_per_s": round(n / resolve_s) if state == "completed" else None,
            "mem_bytes_per_node": round((s1.memory - s0.memory) / n, 1),
            "mem_clients_delta_bytes": s1.clients - s0.clients,
            "round_trips_per_node": {
                "add": round(add_trips / n, 4),
                "resolve": round(res_trips / n, 3),
                "total": round((add_trips + res_trips) / n, 3),
            },
            "redis_commands_per_node": {
                "add": round(add_cmds / n, 2),
                "resolve": round(res_cmds / n, 2),
            },
            "scripts_per_node": round((s2.evals - s0.evals) / n, 3),
            "script_us_per_node": {
                "add": round((s1.eval_usec - s0.eval_usec) / n, 2),
                "resolve": round((s2.eval_usec - s1.eval_usec) / n, 2),
            },
            "redis_cpu_us_per_node": {
                "add": round((s1.cpu - s0.cpu) * 1e6 / n, 2),
                "resolve": round((s2.cpu - s1.cpu) * 1e6 / n, 2),
            },
            "worker_cpu_s": round(worker_cpu, 3),
            "worker_cpu_us_per_node": round(worker_cpu * 1e6 / n, 1),
            "timeline_ms": timeline,
            "processes": stats,
            "root_state": state,
            "values_ok": check["ok"],
            "values_checked": check["values"],
            "problems": check["problems"],
        }
    )
    return row


def _timeline(times: list, go_ms: float) -> dict:
    """When, in ms after ``go``, the first job started, the last non-root
    job finished, and the root started and finished (from the rows' own
    timestamps, so it shows the worker start-up, the drain and the root)."""
    rest = times[1:]
    starts = [s for s, _ in rest if s]
    ends = [f for _, f in rest if f]
    root_start, root_end = times[0]

    def rel(v):
        return None if v is None else round(v - go_ms, 1)

    return {
        "first_start": rel(min(starts, default=None)),
        "last_child_end": rel(max(ends, default=None)),
        "root_start": rel(root_start),
        "root_end": rel(root_end),
    }


def median_row(runs: list[dict]) -> dict:
    """One row for repeated runs: the medians of add and resolve time (and
    their nodes/s) and of memory per node; every run's figures are kept under
    ``repeats``; the counts (round trips, commands, CPU, timeline) are the
    first run's; the values check must hold in every run."""
    if len(runs) == 1:
        return runs[0]
    import statistics

    row = dict(runs[0])
    n = row["nodes"]
    add_ms = statistics.median(r["add_ms"] for r in runs)
    row["add_ms"], row["add_nodes_per_s"] = add_ms, round(n * 1000 / add_ms)
    times = [r["resolve_s"] for r in runs]
    if None not in times:
        row["resolve_s"] = statistics.median(times)
        row["resolve_nodes_per_s"] = round(n / row["resolve_s"])
    else:
        row["resolve_s"] = row["resolve_nodes_per_s"] = None
    row["mem_bytes_per_node"] = statistics.median(r["mem_bytes_per_node"] for r in runs)
    row["values_ok"] = all(r["values_ok"] for r in runs)
    row["problems"] = [p for r in runs for p in r["problems"]]
    row["repeats"] = [
        {
            "add_ms": r["add_ms"],
            "resolve_s": r["resolve_s"],
            "mem_bytes_per_node": r["mem_bytes_per_node"],
        }
        for r in runs
    ]
    row["counts_from"] = "the first run"  # round trips, commands, CPU, timeline
    return row
