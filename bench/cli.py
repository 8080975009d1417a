"""``python -m bench``: the flow benchmark, ours and BullMQ's side by side.

See ``python -m bench --help`` and docs/explanation/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import redis

from echomq_django.testing.redis_server import start_server

from . import peer as _peer
from .report import evaluate_targets, format_table, ratio, ratios
from .runner import Layout, Probe, Progress, median_row, run_one
from .topologies import Topology, default_topologies

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Add and resolve the benchmark's flow topologies with echomq_django and, when "
        "its Python client is installed, BullMQ, on the same Redis server.",
    )
    p.add_argument(
        "--redis-url",
        help="use this Redis (it is FLUSHALLed between runs!) "
        "instead of starting a private redis-server on a free loopback port",
    )
    p.add_argument(
        "--sizes",
        default="100,1000,10000",
        help="children of the wide topologies, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--tree",
        default="20x2000",
        help="the 3-tier tree as BRANCHESxLEAVES, or 'none' (default %(default)s)",
    )
    p.add_argument(
        "--cross",
        type=int,
        default=10000,
        help="children of the cross-queue topology, 0 to skip (default %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: --sizes 100 --tree 5x100 --cross 100 --latency-samples 5 "
        "--plain-jobs 500 --idle-seconds 1",
    )
    p.add_argument(
        "--scenarios",
        default="flows,latency,plain",
        help="which scenarios to run, comma-separated: flows (the topologies), latency "
        "(an idle worker's latencies through the real commands), plain (10,000 plain jobs: "
        "bulk add and drain), wait (enqueue -> wait() returns, and many waiters at once, vs "
        "BullMQ's waitUntilFinished in Node) (default %(default)s)",
    )
    p.add_argument(
        "--wait-samples",
        type=int,
        default=200,
        help="round trips of the wait scenario (default %(default)s)",
    )
    p.add_argument(
        "--waiters",
        type=int,
        default=1000,
        help="concurrent waiters of the wait scenario (default %(default)s)",
    )
    p.add_argument(
        "--waiter-processes",
        type=int,
        default=1,
        help="processes our waiters are spread over, as a site's web processes are "
        "(default %(default)s: all threads of one process)",
    )
    p.add_argument(
        "--latency-samples",
        type=int,
        default=200,
        help="samples per latency measurement (default %(default)s)",
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="how long the latency scenario counts an idle worker's Redis commands "
        "(default %(default)s)",
    )
    p.add_argument(
        "--plain-jobs",
        type=int,
        default=10000,
        help="jobs of the plain scenario (default %(default)s)",
    )
    p.add_argument(
        "--workers",
        default="2x50",
        help="our worker layout, PROCESSESxCONCURRENCY (default %(default)s)",
    )
    p.add_argument(
        "--peer-workers",
        default=None,
        help="BullMQ's worker layout (default: the same as --workers)",
    )
    peer = p.add_mutually_exclusive_group()
    peer.add_argument(
        "--peer",
        dest="peer",
        action="store_true",
        default=None,
        help="require the BullMQ side (fail when bullmq is not installed)",
    )
    peer.add_argument("--no-peer", dest="peer", action="store_false", help="run echomq_django only")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="also run ours through the flow topologies on a private 3-master Redis Cluster "
        "(the test rig; rows 'cluster', with ratios against BullMQ's one server)",
    )
    p.add_argument(
        "--systems",
        default="echomq,bullmq",
        help="which sides to run, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each topology this many times and report the medians "
        "(default %(default)s; a busy machine is noisy)",
    )
    p.add_argument(
        "--block-timeout",
        "--poll-interval",  # its former name
        dest="poll_interval",
        type=float,
        default=None,
        help="our Worker's longest single blocking wait (s) on its wake keys "
        "(default: the Worker's)",
    )
    p.add_argument(
        "--pump-interval",
        type=float,
        default=0.05,
        help="our Pump's sweep interval (s), cross-queue (default %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="give up on a run's resolution after this many s (default %(default)s)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        help="where to write the results (default bench/results/<timestamp>.json)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="profile (pyinstrument) the adds and every worker/pump process into DIR",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress line on stderr (default: when stderr is a terminal)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.tree, args.cross = "100", "5x100", 100
        args.latency_samples, args.plain_jobs, args.idle_seconds = 5, 500, 1.0
        args.wait_samples, args.waiters = 5, 50
    args.scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    unknown = args.scenarios - {"flows", "latency", "plain", "wait"}
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}: use flows, latency, plain, wait")
    return args


def topologies(args) -> list[Topology]:
    sizes = [int(s.replace("_", "").replace(",", "")) for s in args.sizes.split(",") if s]
    tree = None
    if args.tree and args.tree.lower() != "none":
        branches, leaves = (int(v) for v in args.tree.lower().split("x"))
        tree = (branches, leaves)
    return default_topologies(sizes, tree, args.cross)


def machine(url: str) -> dict:
    client = redis.Redis.from_url(url)
    try:
        server = client.info("server")
    finally:
        client.close()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis": server["redis_version"],
        "server": (  # Valkey answers redis_version 7.2.4 and names itself
            f"Valkey {server['valkey_version']}"
            if server.get("server_name") == "valkey"
            else f"Redis {server['redis_version']}"
        ),
        "git_commit": commit or None,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        topos = topologies(args)
        ours_layout = Layout.parse(args.workers)
        peer_layout = Layout.parse(args.peer_workers or args.workers)
    except ValueError as err:
        print(f"python -m bench: {err}", file=sys.stderr)
        return 2
    peer_version = _peer.available()
    if args.peer and not peer_version:
        print(
            "python -m bench: --peer needs BullMQ's Python client: pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 2
    with_peer = bool(peer_version) and args.peer is not False
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)

    server = None
    url = args.redis_url
    if not url:
        server = start_server(hint="Or pass --redis-url to use a server you started.")
        url = server.url
    try:
        return _run(args, url, topos, ours_layout, peer_layout, with_peer, peer_version)
    finally:
        if server:
            server.stop()


def _run(args, url, topos, ours_layout, peer_layout, with_peer, peer_version) -> int:
    from .ours import Ours

    started = dt.datetime.now(dt.UTC)
    meta = {
        "date": started.isoformat(timespec="seconds"),
        **machine(url),
        "echomq_django": None,
        "bullmq": peer_version if with_peer else None,
        "ours_workers": str(ours_layout),
        "peer_workers": str(peer_layout) if with_peer else None,
        "worker_poll_interval_s": args.poll_interval,
        "pump_interval_s": args.pump_interval,
        "private_server": not args.redis_url,
    }
    probe = Probe(url)
    progress = Progress(args.progress)
    ours = Ours(
        url,
        ours_layout,
        poll_interval=args.poll_interval,
        pump_interval=args.pump_interval,
        profile=args.profile,
    )
    meta["echomq_django"] = ours.version
    wanted = {w.strip() for w in args.systems.split(",")}
    systems = [ours] if "echomq" in wanted else []
    if with_peer and "bullmq" in wanted:
        systems.append(_peer.Peer(url, peer_layout, profile=args.profile))
    print(header(meta), flush=True)
    rows, on_cluster = [], []
    try:
        for topo in topos if "flows" in args.scenarios else []:
            for system in systems:
                runs = [
                    _profiled_run(args, system, topo, probe, progress)
                    for _ in range(max(1, args.repeat))
                ]
                rows.append(median_row(runs))
                print(format_table([rows[-1]], first=len(rows) == 1, ratios_for=rows), flush=True)
        if args.cluster and "flows" in args.scenarios and "echomq" in wanted:
            on_cluster = _flows_cluster(args, topos, ours_layout, progress, rows)
    finally:
        probe.flush()
        for system in systems:
            system.close()
    result = {
        "meta": meta,
        "runs": rows,
        "ratios": ratios(rows),
        "layouts": {r["system"] + " " + r["topology"]: r["layout"] for r in rows},
    }
    if on_cluster:
        result["cluster"] = on_cluster  # ours on a 3-master Cluster: not in the ratios
    if rows:
        result["targets"] = evaluate_targets(rows)
        print()
        print(format_table(rows, first=True, ratios_for=rows, summary=True))
        for line in result["targets"]["lines"]:
            print(line)
    names = [s.name for s in systems]
    if "latency" in args.scenarios:
        result["latency"] = _latency(url, names, args.latency_samples, args.idle_seconds, progress)
    if "plain" in args.scenarios:
        result["plain"] = _plain(url, names, args.plain_jobs, ours_layout, peer_layout)
    if "wait" in args.scenarios:
        result["wait"] = _wait(url, args, with_peer and "bullmq" in wanted, progress)
    path = (
        Path(args.json_path)
        if args.json_path
        else (RESULTS / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
    return 0 if all(r["values_ok"] for r in rows) else 1


def _flows_cluster(args, topos, layout, progress, rows: list[dict]) -> list[dict]:
    """Ours through ``topos`` on a private 3-master Redis Cluster (the test
    rig, ``tests/support/rigs.py``: a checkout of the repo); each row is
    printed with its ratios against BullMQ's row of the topology (one
    server) when there is one. Returns the rows (system ``cluster``)."""
    from tests.support.rigs import start_cluster

    from .ours import Ours

    cluster = start_cluster()
    probe = Probe(cluster.url, cluster=True)
    ours = Ours(cluster.url, layout, poll_interval=args.poll_interval,
                pump_interval=args.pump_interval, cluster=True)  # fmt: skip
    out = []
    try:
        for topo in topos:
            runs = [run_one(ours, topo, probe, progress, args.timeout)
                    for _ in range(max(1, args.repeat))]  # fmt: skip
            out.append(median_row(runs))
            print(format_table([out[-1]], first=len(out) == 1), flush=True)
            peer = [r for r in rows if r["system"] == "bullmq" and r["topology"] == topo.key]
            if peer:
                r = ratio(out[-1], peer[0])
                print(f"  BullMQ (one server) / ours on the Cluster: add {r['add_speedup']}x, "
                      f"resolve {r['resolve_speedup']}x; memory ours/theirs {r['memory_ratio']}",
                      flush=True)  # fmt: skip
    finally:
        probe.flush()
        ours.close()
        progress.clear()
        cluster.stop()
    return out


def _latency(url: str, names: list[str], samples: int, idle_s: float, progress) -> list[dict]:
    """The latency scenario (bench/latency.py), ours then BullMQ's."""
    from . import latency

    rows = []
    for name in names:
        side = latency.OurSide(url) if name == "echomq" else latency.PeerSide(url)
        try:
            rows.append(latency.run_side(side, url, samples, idle_s, progress=progress.show))
        finally:
            side.close()
            progress.clear()
    if "echomq" in names:  # ours on a Cluster too (BullMQ's side: one server only)
        rows.append(_latency_cluster(samples, progress))
    print()
    print(f"latency: an idle worker, default settings ({samples} samples each)")
    for row in rows:
        print(f"  {row['system']}: {row['layout']}")
    print(latency.format_rows(rows), flush=True)
    return rows


def _latency_cluster(samples: int, progress) -> dict:
    """Ours in the latency scenario on a private 3-master Redis Cluster (the
    test suite's rig, ``tests/support/rigs.py``: a checkout of the repo)."""
    from tests.support.rigs import start_cluster

    from . import latency

    cluster = start_cluster()
    side = latency.OurSide(cluster.url, cluster=True)
    try:
        return latency.run_side(side, cluster.url, samples, progress=progress.show)
    finally:
        side.close()
        progress.clear()
        cluster.stop()


def _plain(url: str, names: list[str], jobs: int, ours_layout, peer_layout) -> list[dict]:
    """The plain-jobs scenario (bench/plain.py), ours then BullMQ's."""
    from . import plain

    rows = []
    for name in names:
        if name == "echomq":
            side = plain.OurPlain(url, ours_layout)
        else:
            side = plain.PeerPlain(url, peer_layout)
        try:
            rows.append(plain.run_side(side, url, jobs))
        finally:
            side.close()
    print()
    print(f"plain jobs: {jobs:,} independent jobs, bulk add, then drained by the worker layout")
    print(plain.format_rows(rows), flush=True)
    return rows


def _wait(url: str, args, with_peer: bool, progress) -> list[dict]:
    """The wait scenario (bench/waits.py): ours, then BullMQ's in Node when installed."""
    from . import waits

    node = waits.node_bullmq() if with_peer else None
    try:
        rows = waits.run(
            url, args.wait_samples, args.waiters, bool(node), args.waiter_processes, progress.show
        )
    finally:
        progress.clear()
    print()
    peer = f"Node bullmq {node}" if node else "not run: npm install --prefix bench/node"
    print(
        f"wait: {args.wait_samples} round trips on an idle worker, then {args.waiters:,} "
        f"waiters at once (BullMQ: {peer})"
    )
    print(waits.format_rows(rows), flush=True)
    return rows


def _profiled_run(args, system, topo, probe, progress) -> dict:
    if not args.profile:
        return run_one(system, topo, probe, progress, args.timeout)
    from pyinstrument import Profiler

    real_add = system.add
    profiler = Profiler(interval=0.0002)

    def add(description):
        profiler.start()
        try:
            return real_add(description)
        finally:
            profiler.stop()

    system.add = add
    try:
        return run_one(system, topo, probe, progress, args.timeout)
    finally:
        del system.add
        out = Path(args.profile) / f"add-{system.name}-{topo.key}.txt"
        out.write_text(profiler.output_text(unicode=True, color=False))


def header(meta: dict) -> str:
    lines = [
        f"echomq_django flow benchmark, {meta['date']}",
        f"machine: {meta['cpus']} CPUs ({meta['cpu_model'] or 'unknown'}), {meta['platform']}",
        (
            f"{meta['server']} "
            f"({'private server' if meta['private_server'] else 'given URL'}), "
            f"Python {meta['python']}, echomq_django {meta['echomq_django']} @ "
            f"{meta['git_commit'] or '?'}, bullmq {meta['bullmq'] or '(not installed: ours only)'}"
        ),
        (
            f"workers: echomq {meta['ours_workers']} (processes x concurrency, blocking "
            f"on wake keys; cross-queue adds 1 Pump process, sweeping every "
            f"{meta['pump_interval_s']:g} s)"
            + (f"; bullmq {meta['peer_workers']}" if meta["peer_workers"] else "")
        ),
    ]
    return "\n".join(lines)
