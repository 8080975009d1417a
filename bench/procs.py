"""Worker and pump processes of a benchmark run (``multiprocessing`` spawn
targets, so each starts clean: its own interpreter, Redis connections and,
for ours, Django configured by ``settings.configure``).

Every process gets ready (imports, connections) before the clock starts,
then blocks on ``go``; the run's resolution time starts when ``go`` is set
and ends when the root is seen completed. ``stop`` ends the process; it
puts ``{"role", "pid", "cpu_s", ...}`` on ``results`` as it leaves.
"""

from __future__ import annotations

import os
import threading
import time

PREFIX = "emq"


def setup_django(
    url: str, apps: tuple[str, ...] = (), database: str | None = None, cluster: bool = False
) -> None:
    """Configure Django for a benchmark process: no apps but ``apps`` (the
    commands need ``echomq_django`` installed), no database but the SQLite
    file ``database`` when given (the commands check the enqueue outbox's
    table); ``cluster``: ``url`` is a node of a Redis Cluster. The handlers
    are registered by importing ``bench.handlers``."""
    os.environ["ECHOMQ_URL"] = url
    os.environ["ECHOMQ_CLUSTER"] = "1" if cluster else "0"  # bench.handlers' client
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=list(apps),
            DATABASES=(
                {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database}}
                if database
                else {}
            ),
            USE_TZ=True,
            ECHOMQ={"URL": url, "PREFIX": PREFIX, "CLUSTER": cluster},
            LOGGING_CONFIG=None,
        )
        django.setup()


def _mq(url: str, cluster: bool = False):
    import redis
    from redis.cluster import RedisCluster

    from echomq_django import EchoMQ

    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    return EchoMQ(client, prefix=PREFIX)


def _profiled(profile: str | None, name: str):
    """A started pyinstrument profiler when ``profile`` (a directory) is set."""
    if not profile:
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    profiler._emq_path = os.path.join(profile, f"{name}-{os.getpid()}")
    return profiler


def _save(profiler) -> None:
    if profiler is None:
        return
    profiler.stop()
    with open(profiler._emq_path + ".txt", "w") as fh:
        fh.write(profiler.output_text(unicode=True, color=False, show_all=False))
    with open(profiler._emq_path + ".html", "w") as fh:
        fh.write(profiler.output_html())


def our_worker(
    url, queues, concurrency, options, profile, ready, go, stop, results, cluster=False
) -> None:
    """One ``echomq_django.Worker`` process on ``queues`` (``cluster``: ``url``
    is a node of a Redis Cluster)."""
    setup_django(url, cluster=cluster)
    import bench.handlers  # noqa: F401  (registers the bench.* handlers)
    from echomq_django import Worker

    mq = _mq(url, cluster)
    worker = Worker(queues, concurrency=concurrency, mq=mq, **options)
    mq.client.ping()  # connected before the clock starts
    ready.put(os.getpid())
    go.wait()
    cpu = time.process_time()
    threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
    profiler = _profiled(profile, "worker")
    worker.run()
    _save(profiler)
    results.put(
        {
            "role": "worker",
            "pid": os.getpid(),
            "cpu_s": time.process_time() - cpu,
            "processed": worker.processed,
            **worker.stats,
        }
    )


def our_pump(url, queues, interval, profile, ready, go, stop, results, cluster=False) -> None:
    """One ``echomq_django.Pump`` process sweeping ``queues`` every ``interval`` s."""
    setup_django(url, cluster=cluster)
    from echomq_django import Pump

    mq = _mq(url, cluster)
    pump = Pump(queues, mq=mq)
    mq.client.ping()
    ready.put(os.getpid())
    go.wait()
    cpu = time.process_time()
    profiler = _profiled(profile, "pump")
    pump.run(interval=interval, should_stop=stop.is_set)
    _save(profiler)
    results.put(
        {
            "role": "pump",
            "pid": os.getpid(),
            "cpu_s": time.process_time() - cpu,
            "delivered": pump.totals.delivered,
            "released": pump.totals.released,
        }
    )


async def _peer(url, queues, profile, ready, go, stop, results) -> None:
    import asyncio

    from bullmq import Worker

    from bench.topologies import handler_value

    async def process(job, token):
        return handler_value(job.name, job.data)

    workers = [
        Worker(q, process, {"connection": url, "concurrency": c, "autorun": False})
        for q, c in queues
    ]
    for w in workers:  # connected, version checked, before the clock starts
        await w.backend.connection.conn.ping()
        await w.backend.connection.getRedisVersion()
    loop = asyncio.get_running_loop()
    ready.put(os.getpid())
    await loop.run_in_executor(None, go.wait)
    cpu = time.process_time()
    profiler = _profiled(profile, "peer-worker")
    tasks = [asyncio.ensure_future(w.run()) for w in workers]
    await loop.run_in_executor(None, stop.wait)
    _save(profiler)
    results.put({"role": "peer-worker", "pid": os.getpid(), "cpu_s": time.process_time() - cpu})
    results.close()
    results.join_thread()
    # Worker.close() can hang when it lands while the worker's blocking
    # BZPOPMIN is being cancelled (bullmq 3.4.4), and so can asyncio.run's
    # cleanup: give it a few seconds, then leave (the results are sent).
    closing = asyncio.ensure_future(asyncio.gather(*(w.close() for w in workers)))
    await asyncio.wait({closing, *tasks}, timeout=3, return_when=asyncio.ALL_COMPLETED)
    os._exit(0)


def peer_worker(url, queues, profile, ready, go, stop, results) -> None:
    """One process running a BullMQ ``Worker`` per ``(queue, concurrency)``."""
    import asyncio
    import warnings

    warnings.simplefilter("ignore")
    asyncio.run(_peer(url, queues, profile, ready, go, stop, results))
