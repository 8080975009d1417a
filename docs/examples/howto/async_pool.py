"""Handlers on the async pool (docs/howto/async-handlers.md#the-async-pool)."""

import asyncio

from asgiref.sync import sync_to_async

import echomq_django as emq


@emq.handler("hooks.deliver")
async def deliver(job):
    """Waits on I/O (here a sleep, in life an ``httpx.AsyncClient`` call):
    on ``--pool async`` a hundred of these wait at once on one event loop."""
    await asyncio.sleep(job.payload["wait_s"])
    await job.alog(f"delivered to {job.payload['url']}")
    return {"url": job.payload["url"], "status": 200}


def checksum(data: bytes) -> int:
    """Blocking work (CPU, a sync client): never called on the loop itself."""
    return sum(data) % 65_521


@emq.handler("hooks.sign")
async def sign(job):
    """Moves its blocking call off the loop: ``sync_to_async`` runs it on
    the job's slot thread, and the loop serves the other jobs meanwhile."""
    return await sync_to_async(checksum)(job.payload["body"].encode())


def run_hooks_once():
    """What ``manage.py runworker hooks --pool async --concurrency 100
    --burst`` runs."""
    worker = emq.Worker(["hooks"], concurrency=100, pool="async", register=False)
    return worker.run(burst=True)
