"""The benchmark's handlers: each returns a small value at once (its node's
index, ``"done"`` for the root; the latency scenario's ``bench.lat`` records
its start). Imported by every worker process."""

import asyncio
import functools
import os

import redis
from redis.cluster import RedisCluster

from echomq_django import handler

from . import latency
from .topologies import BRANCH, LEAF, ROOT


@functools.cache
def _client() -> redis.Redis:
    """The benchmark's Redis (a Cluster when ``ECHOMQ_CLUSTER`` is ``1``)."""
    if os.environ.get("ECHOMQ_CLUSTER") == "1":
        return RedisCluster.from_url(os.environ["ECHOMQ_URL"])
    return redis.Redis.from_url(os.environ["ECHOMQ_URL"])


@handler("bench.lat")
def lat(job):
    latency.record(_client(), job.payload)


@handler("bench.one")
def one(job):
    return 1


@handler("bench.async_turn")
async def async_turn(job):
    """An ``async def`` handler that yields once to its loop (bench.async_pool)."""
    await asyncio.sleep(0)


@handler("bench.async_wait")
async def async_wait(job):
    """An I/O-bound ``async def`` handler: waits 50 ms (bench.async_pool)."""
    await asyncio.sleep(0.05)


@handler(LEAF)
def leaf(job):
    return job.payload["i"]


@handler(BRANCH)
def branch(job):
    return job.payload["i"]


@handler(ROOT)
def root(job):
    return "done"
