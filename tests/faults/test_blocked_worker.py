"""A worker blocked on its wake keys when Redis goes away: a Redis restart and
a Cluster failover under a blocking wait. The worker reconnects and resumes
without losing a wake-up or a job; the paths are asserted (the reconnect was
seen, the job was claimed after it), with a blocking timeout and sweep
interval no test waits for."""

from __future__ import annotations

import pytest
import redis

from echomq_django import EchoMQ, JobState, Worker
from echomq_django.testing.redis_server import restart
from tests.support import rigs
from tests.support.workerkit import Background, wait_for

pytestmark = pytest.mark.e2e
NEVER = 3600.0


def _worker(mq, queues, sweep_interval: float = NEVER) -> Background:
    worker = Worker(
        queues, mq=mq, concurrency=2, block_timeout=NEVER, sweep_interval=sweep_interval
    )
    bg = Background(worker)
    wait_for(lambda: worker.waiting, what="the worker blocking on its queues")
    return bg


def test_a_redis_restart_under_a_blocking_wait_loses_no_job() -> None:
    server = rigs.start_server(options={"appendonly": "yes", "appendfsync": "always"})
    bg = None
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        mq = EchoMQ(client, prefix="emq", queues={"r": {"LEASE_MS": 60_000}})
        # a claim Redis ran just before it was killed, whose reply never came
        # back, gives its job back when the worker asks again with that
        # claim's token (the memo is in the AOF): no lease expiry and no
        # sweep is waited for (both are longer than the test's wait)
        bg = _worker(mq, ["q", "r"])
        worker = bg.worker
        # a job lands (the AOF has it) and Redis dies right after: claimed
        # before the kill, or after the restart, it runs once
        mq.enqueue("r", "t.echo", "kept", job_id="before")
        server.proc.kill()
        server.proc.wait()
        server = restart(server)
        mq.enqueue("q", "t.echo", "after", job_id="after")
        wait_for(lambda: worker.stats["completed"] == 2, timeout=30, what="both jobs")
        assert mq.get_job("r", "before").result == "kept"
        assert mq.get_job("q", "after").state is JobState.COMPLETED
        # (no poll could have run it: the blocking timeout is an hour)
        wait_for(lambda: worker.waiting, what="the worker blocking again")
    finally:
        if bg is not None:
            bg.worker.stop()
            bg.join()
        server.stop()


def test_a_worker_goes_on_after_its_queue_master_fails_over(redis_cluster_ha, rch) -> None:
    mq = EchoMQ(rch, prefix="emq")
    key = mq.keys.queue("orders").wake
    bg = _worker(mq, ["orders", "other"])
    dead = redis_cluster_ha.kill_master(key)
    try:
        redis_cluster_ha.wait_promoted(key, dead)
        mq.enqueue("orders", "t.echo", 5, job_id="x")
        wait_for(lambda: bg.worker.stats["completed"] == 1, timeout=30, what="the job")
        assert mq.get_job("orders", "x").result == 5
        assert bg.worker.wakeups["claimable"] + bg.worker.wakeups["reconnect"] >= 1
    finally:
        bg.worker.stop()
        bg.join()
        redis_cluster_ha.restart(dead)
