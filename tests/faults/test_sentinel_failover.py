"""Redis Sentinel: the settings' client finds the master through the
sentinels (``SENTINELS`` + ``MASTER_NAME``, or a ``redis+sentinel://``
URL), and a failover (``SENTINEL FAILOVER``) under a running producer and
worker loses nothing: both go on with the same client, without a restart,
and every job added runs to completed (docs/howto/sentinel.md)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from echomq_django import DuplicateJob, EchoMQ, EchoMQError, JobState, Worker
from echomq_django.conf import build_client
from tests.support import sentinelkit
from tests.support.workerapp import jobs as _handlers  # noqa: F401  (t.echo)
from tests.support.workerkit import Background, wait_for

pytestmark = pytest.mark.e2e
JOBS = 150


@pytest.fixture(scope="module")
def sentinel_rig():
    rig = sentinelkit.start_sentinel_rig()
    try:
        yield rig
    finally:
        rig.stop()


def sentinel_mq(rig, **options) -> EchoMQ:
    cfg = {"SENTINELS": rig.sentinels, "MASTER_NAME": sentinelkit.MASTER_NAME}
    return EchoMQ(build_client(cfg | options), prefix="emq")


def test_both_shapes_reach_the_master(sentinel_rig, no_env_url) -> None:
    by_list = sentinel_mq(sentinel_rig)
    by_url = EchoMQ(build_client({"URL": sentinel_rig.url}), prefix="emq")
    by_list.client.flushall()
    job_id = by_list.enqueue("s", "t.echo", 7)
    assert by_url.get_job("s", job_id).state is JobState.PENDING
    port = by_url.client.connection_pool.get_master_address()[1]
    assert port == sentinel_rig.master_port()


class Producer(threading.Thread):
    """Adds ``JOBS`` jobs with fixed ids, one at a time; a call that meets
    the failover is tried again with the same id (a ``DuplicateJob`` says
    the first try landed). An add counts once a replica has it (``WAIT``):
    the master acknowledges alone, and what it took in the last moment before
    its replica was promoted is lost (docs/howto/sentinel.md); an add no
    replica confirmed is sent again. Records what it met."""

    def __init__(self, mq: EchoMQ, started: threading.Event) -> None:
        super().__init__(daemon=True)
        self.mq, self.started = mq, started
        self.added: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        for i in range(JOBS):
            job_id = f"p{i}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    try:
                        self.mq.enqueue("s", "t.echo", i, job_id=job_id)
                    except DuplicateJob:
                        pass
                    # the same connection: WAIT counts this connection's writes
                    if self.mq.client.execute_command("WAIT", 1, 2000) >= 1:
                        break
                    self.errors.append("unconfirmed")
                except (EchoMQError, redis.RedisError) as err:
                    self.errors.append(type(err).__name__)
                time.sleep(0.05)
            self.added.append(job_id)
            if i == JOBS // 3:
                self.started.set()
            time.sleep(0.02)


def test_a_failover_under_a_producer_and_a_worker_loses_nothing(sentinel_rig, no_env_url) -> None:
    sentinel_mq(sentinel_rig).client.flushall()
    producer_mq, worker_mq, reader = (sentinel_mq(sentinel_rig) for _ in range(3))
    started = threading.Event()
    producer = Producer(producer_mq, started)
    worker = Worker(["s"], concurrency=2, mq=worker_mq, poll_interval=0.05)
    running = Background(worker)
    before = sentinel_rig.master_port()
    producer.start()
    try:
        assert started.wait(30)
        after = sentinel_rig.failover()
        producer.join(120)
        assert not producer.is_alive()
        wait_for(
            lambda: reader.counts("s")["completed"] == JOBS, timeout=90, what="every job completed"
        )
    finally:
        worker.stop()
        running.join(60)
    assert (after != before, len(producer.added)) == (True, JOBS)
    counts = reader.counts("s")
    assert (counts["completed"], counts["pending"], counts["active"], counts["dead"]) == (
        JOBS,
        0,
        0,
        0,
    )
    results = {reader.get_job("s", f"p{i}").result for i in range(JOBS)}
    assert results == set(range(JOBS))
    # the same clients now talk to the new master
    assert producer_mq.client.connection_pool.get_master_address()[1] == after
    assert worker_mq.client.connection_pool.get_master_address()[1] == after
