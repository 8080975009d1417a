"""Round trips on a flow's critical path, counted
(docs/explanation/performance.md#counting-the-round-trips).

On one private redis-server (``--cluster``: a private 3-master Redis
Cluster, the test rig, one ``MONITOR`` per master merged by the server's
clock), the latency scenario's processes (``runworker
lat lat-kids`` and ``runpump lat lat-kids --no-mirror``, defaults, as in
``bench/latency.py``) get a parent + 2 children, the children on the
parent's queue (``flow_same``) or on another (``flow_cross``), one sample at
a time. A ``MONITOR`` connection records every command the server runs from
the add's first command to the parent handler's own ``RPUSH`` of its
latency. Timings on a shared machine cannot tell one round trip from the
noise; this count can.

A **round trip** here is a run of top-level commands one connection sent
with no other connection's command between them (a pipeline, or a lone
command or script); the commands a script runs inside (``lua`` in
``MONITOR``) belong to its call and are not counted. Left out: the
sample's own add (the first trip) and its final ``RPUSH``, the benchmark's
``BLPOP``, and the heartbeats. A blocking command popped by another
connection's write (a wake-up) shows only as the trip after it; each trip
is printed with its connection (a letter per connection, in order of
appearance) and its µs after the add, so the path reads in order.

    .venv/bin/python -m bench.round_trips [--samples 5] [--show 1]

Prints, per scenario, the trips of each sample (the median count, and the
first ``--show`` samples trip by trip), and the time from the last child's
``complete`` to the parent's claim by the server's clock (``MONITOR``'s
timestamps: no client's scheduling in the figure but the path's own).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import multiprocessing
import statistics
import threading
import time

import redis

from echomq_django.testing.redis_server import start_server

from . import latency

KINDS = ("flow_same", "flow_cross")
IGNORED = {"BLPOP", "PING", "CLIENT", "INFO", "MONITOR"}
PIPELINED_US = 40  # see trips()
HEARTBEAT = ":live"  # a key of the live-processes registry: a heartbeat's trip


def _watch(url: str, out: list, started: threading.Event, done: threading.Event, key: str):
    """Collect ``MONITOR`` lines of the server at ``url`` into ``out``, each
    tagged with that server's port, until the handler's ``RPUSH`` of sample
    ``key`` (then ``done`` is set) or ``done`` is set by another server's
    watcher (seen at this server's next line), or 10 s."""
    client = redis.Redis.from_url(url)
    port = client.connection_pool.connection_kwargs["port"]
    deadline = time.monotonic() + 10
    with client.monitor() as monitor:
        started.set()
        for line in monitor.listen():
            if done.is_set() or time.monotonic() > deadline:
                break
            out.append(line | {"server": port})
            cmd = line["command"]
            if cmd.startswith("RPUSH") and latency.RECORDS in cmd and key in cmd:
                done.set()
                break
    client.close()


def trips(lines: list[dict]) -> list[tuple[str, float, list[str]]]:
    """The round trips in ``lines`` (``MONITOR`` records, in order): a list
    of ``(connection, µs after the first line, [commands])``; see the module.
    A connection's next command is in the same trip (a pipeline) when no
    other connection's command came between and it started within
    ``PIPELINED_US`` of the end of the one before (the last command that one
    ran inside, for a script): a new trip waits for a reply first, which
    takes a client far longer."""
    out: list[tuple[str, float, list[str]]] = []
    names: dict[str, str] = {}
    t0, last, ended = None, None, 0.0
    for line in lines:
        if line.get("client_type") == "lua":
            ended = line["time"]
            continue
        cmd = line["command"]
        word = cmd.split(" ", 1)[0].upper()
        if word in IGNORED or HEARTBEAT in cmd:
            continue
        conn = f"{line.get('client_address')}:{line.get('client_port')}@{line.get('server')}"
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(names) % 26]
        name = names.setdefault(conn, f"{letter}@{line.get('server')}")
        t0 = line["time"] if t0 is None else t0
        if last == conn and (line["time"] - ended) * 1e6 < PIPELINED_US:
            out[-1][2].append(_short(cmd))
        else:
            out.append((name, (line["time"] - t0) * 1e6, [_short(cmd)]))
        last, ended = conn, line["time"]
    return out


def _short(cmd: str) -> str:
    """A command as printed: a script call by its script's name and first key,
    others cut at 70 characters."""
    parts = cmd.split(" ")
    if parts[0].upper() == "EVALSHA" and len(parts) > 3:
        return f"{_names().get(parts[1].strip(chr(34)), parts[1][:8])} {parts[3]}"
    return cmd[:70]


@functools.cache
def _names() -> dict[str, str]:
    """``{sha1: script name}`` of the package's scripts."""
    from echomq_django.protocol.scripts import load_sources

    return {hashlib.sha1(s.text.encode()).hexdigest(): n for n, s in load_sources().items()}


def tail(found: list) -> list:
    """The trips from the last child's ``complete`` to the last claim of the
    parent's queue (the one that took the parent), both in, wake-up blocks
    left out: what ran between the children's end and the parent's start
    (a trip of another process's among them is not always on the path)."""
    has = lambda trip, word: any(c.startswith(word) for c in trip[2])  # noqa: E731
    start = max((i for i, t in enumerate(found) if has(t, "complete")), default=0)
    parent = f"claim emq:{{{latency.QUEUE}}}:"
    end = max((i for i, t in enumerate(found) if has(t, parent)), default=len(found) - 1)
    return [t for t in found[start : end + 1] if not has(t, "BZPOPMIN")]


def sample(side: latency.OurSide, urls: list[str], client, kind: str, key: str) -> list:
    """One sample of ``kind`` under ``MONITOR`` on each server of ``urls``:
    its round trips (``trips``, every server's lines in the order of the
    servers' clock), the add's first and the handler's ``RPUSH`` left out."""
    outs: list[list] = [[] for _ in urls]
    done = threading.Event()
    watchers = []
    for url, out in zip(urls, outs, strict=True):
        started = threading.Event()
        watchers.append(
            threading.Thread(target=_watch, args=(url, out, started, done, key), daemon=True)
        )
        watchers[-1].start()
        started.wait(5)
    time.sleep(0.05)  # MONITOR is on before the add
    side.send(kind, key)
    got = client.blpop([latency.RECORDS], timeout=5)
    done.set()
    for url in urls:  # a line for each watcher still waiting in MONITOR to see done by
        with redis.Redis.from_url(url) as poke:
            poke.ping()
    for watcher in watchers:
        watcher.join(10)
    if got is None:
        raise RuntimeError(f"{kind}: sample {key} was not handled in 5 s")
    found = trips(sorted((line for out in outs for line in out), key=lambda line: line["time"]))
    add = next(i for i, (_, _, cmds) in enumerate(found) if cmds[0].startswith("enqueue_flow"))
    return found[add + 1 : -1]  # before and with the add; the handler's RPUSH


def run(samples: int, show: int, cluster: bool = False) -> dict:
    """Start a server (``cluster``: a 3-master Cluster, the test rig) and the
    processes, count ``samples`` of each kind; returns ``{kind: {"counts":
    [...], "shown": [trips of the first ``show`` samples]}}``."""
    if cluster:
        from redis.cluster import RedisCluster

        from tests.support.rigs import start_cluster

        server = start_cluster()
        client = RedisCluster.from_url(server.url)
        urls = [f"redis://{n.host}:{n.port}/0" for n in client.get_primaries()]
    else:
        server = start_server()
        client = redis.Redis.from_url(server.url)
        urls = [server.url]
    ctx = multiprocessing.get_context("spawn")
    side = latency.OurSide(server.url, cluster=cluster)
    ready = ctx.Queue()
    processes = side.processes(ctx, ready)
    result: dict = {}
    try:
        for p in processes:
            p.start()
            ready.get(timeout=120)
        time.sleep(2.0)
        for kind in KINDS:  # warm: scripts loaded, paths taken once
            latency.measure(side, client, kind, 3, tag="warm")
        for kind in KINDS:
            counts, tails, spans, wholes, shown, slowest = [], [], [], [], [], []
            for i in range(samples):
                found = sample(side, urls, client, kind, f"{kind}-rt-{i}")
                counts.append(len(found))
                path = tail(found)
                tails.append(len(path))
                spans.append((path[-1][1] - path[0][1]) / 1000 if path else 0.0)
                wholes.append((path[-1][1] - found[0][1]) / 1000 if path else 0.0)
                if i < show:
                    shown.append(found)
                if spans[-1] == max(spans):
                    slowest = found
                time.sleep(0.05)
            result[kind] = {
                "counts": counts,
                "tails": tails,
                "spans": spans,
                "wholes": wholes,
                "shown": shown,
                "slowest": slowest,
            }
        return result
    finally:
        for p in processes:
            if p.pid is not None:
                latency._stop(p)
        side.close()
        client.close()
        server.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.round_trips", description=__doc__)
    p.add_argument("--samples", type=int, default=5, help="samples per scenario (%(default)s)")
    p.add_argument("--show", type=int, default=1, help="samples printed trip by trip")
    p.add_argument(
        "--cluster", action="store_true", help="on a private 3-master Redis Cluster (the test rig)"
    )
    args = p.parse_args(argv)
    if args.samples < 1 or args.show < 0:
        p.error("--samples must be at least 1 and --show at least 0")
    result = run(args.samples, args.show, args.cluster)
    for kind, r in result.items():
        print(f"== {latency.LABELS[kind]}")
        print(f"round trips after the add: {r['counts']}, median {statistics.median(r['counts'])}")
        print(
            "from the last child's complete to the parent's claim (wake-up blocks left out): "
            f"{r['tails']}, median {statistics.median(r['tails'])}"
        )
        for key, what in (("spans", "the last child's complete"), ("wholes", "the first trip")):
            ms = sorted(r[key])
            print(
                f"ms from {what} to the parent's claim (the server's clock): "
                f"median {statistics.median(ms):.2f}, min {ms[0]:.2f}, max {ms[-1]:.2f}"
            )
        for n, found in [*enumerate(r["shown"]), ("the slowest path", r["slowest"])]:
            print(f"-- sample {n}")
            for conn, us, cmds in found:
                print(f"  {conn} +{us:8.0f} us  {' | '.join(cmds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
