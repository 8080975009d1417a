"""``python -m bench --soak``: a queue that runs for a year in bounded memory
(docs/explanation/lifecycle.md#soak).

Pushes ``--soak-jobs`` plain jobs (default 200,000; ``--second-share``
percent of them, default 50, on the second queue) and ``--soak-flows``
small flows (default 20,000: a parent and three children, one flow in ten
with a child on the second queue) through real ``Worker`` processes and one
``Pump`` process (outbox, retention, the admin mirror into a SQLite file),
with the default retention (completed: 1,000 and 1 day; dead: 10,000 and 14
days). Outcomes are mixed: one job in ten fails once and succeeds on its
retry, one in a thousand dies (a dead child fails its flow).

The producer adds work in rounds of ``--soak-every`` jobs (and their share
of flows), ``FEED`` jobs at a time as the workers take them, keeping the
backlog small; after each round it waits until the
queues are drained and the pump's retention has caught up (nothing pending,
active, delayed or in an outbox, the work lists empty), then samples Redis'
``used_memory``, its key count and the mirror's row count. The curve is
printed; the target is ``used_memory`` after the last round within 10% of
after the first (flat), and a mirror bounded by the retention settings.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time

from echomq_django.testing.redis_server import start_server

from . import procs

QUEUES = ("soak", "soak2")
FAIL_ONCE_EVERY = 10  # one job in ten fails once, then succeeds on its retry
DIE_EVERY = 1000  # one job in a thousand dies (Unrecoverable)
CROSS_EVERY = 10  # one flow in ten has a child on the second queue
CHILDREN = 3
LEASE_MS = 5000  # a claim's replay memo lives this long: sampled after it expired
FEED = 1000  # plain jobs added at a time; the next ones once the backlog is under it


def setup_django(url: str, db: str, keep_dead: int | None = None) -> None:
    """Django for a soak process: the app and a SQLite file for the mirror."""
    os.environ["ECHOMQ_URL"] = url
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["echomq_django"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": db}},
            USE_TZ=True,
            ECHOMQ={
                "URL": url,
                "PREFIX": procs.PREFIX,
                "QUEUES": {
                    q: {"LEASE_MS": LEASE_MS}
                    | ({} if keep_dead is None else {"KEEP_DEAD": keep_dead})
                    for q in QUEUES
                },
            },
            LOGGING_CONFIG=None,
        )
        django.setup()
    import logging

    logging.getLogger("echomq_django").setLevel(logging.ERROR)  # dead jobs are expected


def worker(url: str, db: str, concurrency: int, ready, stop, keep_dead=None) -> None:
    """One ``Worker`` process on both soak queues."""
    setup_django(url, db, keep_dead)
    import bench.soak_handlers  # noqa: F401  (registers soak.*)
    from echomq_django import Worker

    w = Worker(list(QUEUES), concurrency=concurrency, poll_interval=0.05)
    ready.put(os.getpid())
    import threading

    threading.Thread(target=lambda: (stop.wait(), w.stop()), daemon=True).start()
    w.run()


def pump(url: str, db: str, interval: float, ready, stop, keep_dead=None) -> None:
    """One ``Pump`` process: outbox, timers, retention and the admin mirror."""
    setup_django(url, db, keep_dead)
    from echomq_django import Pump
    from echomq_django.monitoring.mirror import mirror_after_sweep

    p = Pump(list(QUEUES), after_sweep=[mirror_after_sweep])
    ready.put(os.getpid())
    p.run(interval=interval, should_stop=stop.is_set)


def _backlog(mq) -> int:
    """Jobs added and not finished yet, on both queues."""
    total = 0
    for q in QUEUES:
        c = mq.counts(q)
        total += c["pending"] + c["active"] + c["delayed"] + c["awaiting_children"]
    return total


def _add_round(mq, start: int, jobs: int, flows: int, second_share: int = 50) -> None:
    """Add one round at the rate the workers take it: ``FEED`` plain jobs
    (``second_share`` % of them on the second queue) and their share of
    flows at a time, the next ones once the backlog is back under ``FEED``.
    A round added at once would leave a backlog of ~30,000 rows, and Redis'
    keyspace table, sized for its peak, shrinks only below a tenth full:
    whether it had shrunk by a sample moved ``used_memory`` by ~250 KB."""
    done_jobs = done_flows = 0
    while done_jobs < jobs:
        n = min(FEED, jobs - done_jobs)
        m = flows * (done_jobs + n) // jobs - done_flows
        _add_chunk(mq, start + done_jobs, n, start // 10 + done_flows, m, second_share)
        done_jobs, done_flows = done_jobs + n, done_flows + m
        while _backlog(mq) > FEED:
            time.sleep(0.05)


def _add_chunk(mq, at: int, jobs: int, first_flow: int, flows: int, second_share: int) -> None:
    from echomq_django import Flow

    for i in range(at, at + jobs):
        q = QUEUES[1] if (i * 37) % 100 < second_share else QUEUES[0]
        mq.enqueue(q, "soak.job", {"i": i}, max_attempts=2, backoff_ms=0)
    batch = []
    for f in range(first_flow, first_flow + flows):
        kids = [
            Flow(
                QUEUES[1] if (f % CROSS_EVERY == 0 and c == 0) else QUEUES[0],
                "soak.job",
                {"i": f * CHILDREN + c},
                max_attempts=2,
                backoff_ms=0,
            )
            for c in range(CHILDREN)
        ]
        batch.append(Flow(QUEUES[0], "soak.parent", {"f": f}, children=kids))
        if len(batch) == 200:
            mq.add_flows(batch)
            batch = []
    if batch:
        mq.add_flows(batch)


def _settled(mq) -> bool:
    c = mq.client
    for q in QUEUES:
        counts = mq.counts(q)
        if counts["pending"] or counts["active"] or counts["delayed"] or counts["outbox"]:
            return False
        if counts["awaiting_children"]:
            return False
        k = mq.keys
        if c.exists(k.queue_key(q, "gc"), k.queue_key(q, "cancel")):
            return False
        completed, dead = mq.lifecycle.retention(q)
        if counts["completed"] > completed.count or counts["dead"] > dead.count:
            return False
    return True


def key_kinds(client) -> dict[str, tuple[int, int]]:
    """Keys by kind (the part after ``P:{q}:`` with ids cut off, a job row's
    hash tagged with its encoding): ``{kind: (keys, bytes)}``, bytes by
    ``MEMORY USAGE``, largest first."""
    kinds: dict[str, tuple[int, int]] = {}
    for key in client.scan_iter(count=1000):
        name = key.decode().split("}:", 1)[-1]
        parts = name.split(":")
        kind = parts[0] if parts[0] != "job" else ":".join(["job", *parts[2:]])
        if kind == "job":
            kind = f"job ({client.object('encoding', key).decode()})"
        n, size = kinds.get(kind, (0, 0))
        kinds[kind] = (n + 1, size + (client.memory_usage(key, samples=0) or 0))
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1][1]))


def _print_growth(out, first: dict, last: dict, jobs: tuple[int, int]) -> None:
    """Keys and bytes by kind at the first and the last sample, and what
    each kind grew by: where the memory went, kind by kind."""
    out(f"keys by kind, after {jobs[0]:,} jobs -> after {jobs[1]:,}:")
    out(f"    {'kind':24} {'keys':>6} {'':>6} {'bytes':>11} {'':>11} {'grew':>9}")
    total = 0
    for kind in sorted(set(first) | set(last), key=lambda k: -last.get(k, (0, 0))[1]):
        (n0, b0), (n1, b1) = first.get(kind, (0, 0)), last.get(kind, (0, 0))
        total += b1 - b0
        out(f"    {kind:24} {n0:>6} {n1:>6} {b0:>11,} {b1:>11,} {b1 - b0:>+9,}")
    out(f"    {'all keys':24} {'':>6} {'':>6} {'':>11} {'':>11} {total:>+9,}")


OVERHEADS = ("clients.normal", "lua.caches", "functions.caches", "overhead.hashtable.main",
             "overhead.hashtable.expires", "dataset.bytes")  # fmt: skip


def memory_parts(client) -> dict[str, int]:
    """``MEMORY STATS``' parts of ``used_memory`` that are not one key's
    ``MEMORY USAGE`` (client buffers, script caches, the keyspace's own
    hash tables) and ``dataset.bytes``: ``{name: bytes}``."""
    stats = client.memory_stats()
    db0 = stats.get("db.0", {})
    return {name: int(stats.get(name, db0.get(name, 0))) for name in OVERHEADS}


def _print_parts(out, first: dict, last: dict) -> None:
    out("used_memory's other parts (MEMORY STATS), first -> last sample:")
    for name in OVERHEADS:
        out(f"    {name:31} {first[name]:>11,} {last[name]:>11,} {last[name] - first[name]:>+9,}")


def _stream_lengths(mq) -> str:
    return ", ".join(f"{q} {mq.client.xlen(mq.keys.queue_key(q, 'events')):,}" for q in QUEUES)


def _sample(mq, db: str) -> dict:
    import sqlite3

    info = mq.client.info("memory")
    with sqlite3.connect(db) as con:
        rows = con.execute("select count(*) from echomq_django_mirroredjob").fetchone()[0]
    counts = {q: mq.counts(q) for q in QUEUES}
    return {
        "used_memory": info["used_memory"],
        "keys": mq.client.dbsize(),
        "mirror_rows": rows,
        "completed": sum(c["completed"] for c in counts.values()),
        "dead": sum(c["dead"] for c in counts.values()),
    }


def run(
    jobs: int = 200_000,
    flows: int = 20_000,
    every: int = 20_000,
    procs_n: int = 2,
    concurrency: int = 16,
    interval: float = 0.2,
    url: str | None = None,
    out=print,
    keep_dead: int | None = None,
    second_share: int = 50,
) -> dict:
    """Run the soak; returns ``{samples: [...], first, last, ratio}``.
    ``second_share``: the percentage (0-100) of plain jobs added to the
    second queue."""
    server = None if url else start_server()
    url = url or server.url
    db = os.path.join(tempfile.mkdtemp(prefix="emq-soak-"), "mirror.sqlite3")
    setup_django(url, db, keep_dead)
    from django.core.management import call_command

    from echomq_django.conf import get_mq

    call_command("migrate", "echomq_django", verbosity=0)
    mq = get_mq()
    mq.client.flushall()
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    children = [
        ctx.Process(target=worker, args=(url, db, concurrency, ready, stop, keep_dead))
        for _ in range(procs_n)
    ]
    children.append(ctx.Process(target=pump, args=(url, db, interval, ready, stop, keep_dead)))
    for p in children:
        p.start()
    for _ in children:
        ready.get(timeout=60)
    samples = []
    try:
        done, started = 0, time.monotonic()
        out(
            f"{'jobs':>8} {'flows':>7} {'used_memory':>12} {'keys':>7} {'mirror':>7} "
            f"{'completed':>9} {'dead':>5} {'s':>6}"
        )
        while done < jobs:
            n = min(every, jobs - done)
            _add_round(mq, done, n, flows * n // jobs, second_share)
            done += n
            while not _settled(mq):
                time.sleep(0.2)
            # claim memos (a replay guard) live one lease: sample the steady
            # state, not the last seconds' claim rate; the mirror follows meanwhile
            time.sleep(LEASE_MS / 1000 + 1)
            s = {
                "jobs": done,
                "flows": flows * done // jobs,
                **_sample(mq, db),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            samples.append(s)
            if len(samples) == 1:
                first_kinds, first_streams = key_kinds(mq.client), _stream_lengths(mq)
                first_parts = memory_parts(mq.client)
            out(
                f"{s['jobs']:>8} {s['flows']:>7} {s['used_memory']:>12,} {s['keys']:>7} "
                f"{s['mirror_rows']:>7} {s['completed']:>9} {s['dead']:>5} {s['elapsed_s']:>6}"
            )
        jobs_at = (samples[0]["jobs"], samples[-1]["jobs"])
        _print_growth(out, first_kinds, key_kinds(mq.client), jobs_at)
        _print_parts(out, first_parts, memory_parts(mq.client))
        streams = f"{first_streams} -> {_stream_lengths(mq)}"
        out(f"events stream entries (cap ~10,000 a queue): {streams}")
    finally:
        stop.set()
        for p in children:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        if server:
            server.stop()
    first, last = samples[0]["used_memory"], samples[-1]["used_memory"]
    ratio = last / first
    out(
        f"used_memory after {samples[-1]['jobs']:,} jobs is {ratio:.3f}x its value after "
        f"{samples[0]['jobs']:,} (target: within 10%); steady state {last:,} bytes"
    )
    return {"samples": samples, "first": first, "last": last, "ratio": ratio}


def main(argv=None) -> int:
    """``python -m bench --soak [--quick] [--soak-jobs N] [--soak-flows N]
    [--soak-every N] [--workers PxC] [--redis-url URL]``; exit 0 when the
    memory target holds, 1 when it does not, 2 for bad flags."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m bench --soak", description=__doc__.split("\n")[0])
    p.add_argument("--soak", action="store_true", help="run the soak (this benchmark)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 20,000 jobs, 2,000 flows")
    p.add_argument(
        "--soak-jobs", type=int, default=200_000, help="plain jobs (default %(default)s)"
    )
    p.add_argument("--soak-flows", type=int, default=20_000, help="flows (default %(default)s)")
    p.add_argument("--soak-every", type=int, default=20_000,
                   help="jobs per round, one sample each (default %(default)s)")  # fmt: skip
    p.add_argument("--workers", default="2x16", help="PROCESSESxCONCURRENCY (default %(default)s)")
    p.add_argument("--redis-url", help="use this Redis (FLUSHALLed!) instead of a private one")
    p.add_argument("--keep-dead", type=int, help="KEEP_DEAD for both queues (default: the default)")
    share = "%% of plain jobs on the second queue, 0-100 (default %(default)s)"
    p.add_argument("--second-share", type=int, default=50, help=share)
    args = p.parse_args(argv)
    if args.quick:
        args.soak_jobs, args.soak_flows, args.soak_every = 20_000, 2_000, 2_000
    try:
        procs_n, concurrency = (int(v) for v in args.workers.lower().split("x"))
        if min(procs_n, concurrency, args.soak_jobs, args.soak_every) < 1 or args.soak_flows < 0:
            raise ValueError
        if not 0 <= args.second_share <= 100:
            raise ValueError
    except ValueError:
        print("python -m bench --soak: --workers is PxC, counts are whole numbers >= 1 and "
              "--second-share is 0-100", file=sys.stderr)  # fmt: skip
        return 2
    result = run(args.soak_jobs, args.soak_flows, args.soak_every, procs_n, concurrency,
                 url=args.redis_url, keep_dead=args.keep_dead,
                 second_share=args.second_share)  # fmt: skip
    return 0 if result["ratio"] <= 1.10 else 1
