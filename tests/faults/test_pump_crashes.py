"""A pump that dies mid-sweep, or whose Redis does: a SIGKILL between
deliver and trim releases every parent once (the next sweep delivers again,
and the entries are recognised); a live peer takes over within the lease of
a pump killed holding the lock; a pump takes its own lock back when Redis
restarts from its append-only file with that lock in it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners.pump import LOCK_MS, Pump
from echomq_django.testing.redis_server import restart
from tests.support import rigs
from tests.support.jobkit import (
    assert_each_parent_released_once,
    released_events,
    wide_cross_flows,
)
from tests.support.workerkit import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


KILLED_BEFORE_TRIM = textwrap.dedent("""
    import os, signal, sys
    import redis
    from echomq_django import EchoMQ
    from echomq_django import Pump

    client = redis.Redis.from_url(sys.argv[1])
    def die(queue, actions):
        print("delivered", len(actions), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    Pump(["c"], mq=EchoMQ(client), lock_ms=300, before_trim=die).sweep()
""")


def test_pump_killed_between_deliver_and_trim_releases_once(r, redis_server):
    mq = EchoMQ(r, cross_queue_scripts=False)  # completions on the flow outbox, as on a Cluster
    wide_cross_flows(mq, parents=5, children=4)
    while jobs := mq.claim("c", 50):
        for job in jobs:
            mq.complete(job, job.id)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_TRIM, redis_server],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == "delivered 20"
    assert mq.counts("c")["outbox"] == 20  # delivered, not trimmed
    assert released_events(mq) == {f"P{i}": 1 for i in range(5)}
    pump = Pump(["c"], mq=mq)
    report = pump.sweep()["c"]
    if report["locked"]:  # the dead pump's lock has not expired yet
        threading.Event().wait(0.4)
        report = pump.sweep()["c"]
    assert (report["delivered"], report["released"]) == (20, 0)
    assert_each_parent_released_once(mq, parents=5, children=4)


def _one_cross_completion(mq) -> None:
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    [job] = mq.claim("c", 1)
    mq.complete(job, 1)  # its completion waits in c's outbox


def test_a_pump_takes_its_own_lock_back_after_a_redis_restart(tmp_path):
    # A 2 s restart used to freeze deliveries for the lock's 30 s: the drop
    # failed while Redis was down, the lock came back from the AOF, and the
    # pump's next sweep (a fresh token) was locked out by its own old lock.
    server = rigs.start_server(options={"appendonly": "yes", "appendfsync": "always"})
    client = redis.Redis(host=rigs.HOST, port=server.port, retry_on_error=[])
    try:
        mq = EchoMQ(client, prefix="emq", cross_queue_scripts=False)  # the outbox's path
        _one_cross_completion(mq)

        def crash_redis(queue, actions):
            server.proc.kill()  # between deliver and trim, while the pump holds its lock
            server.proc.wait()

        pump = Pump(["c"], mq=mq, lock_ms=30_000, before_trim=crash_redis)
        with pytest.raises(RedisUnavailable):
            pump.sweep()
        server = restart(server)  # the lock is back from the AOF, 30 s to live
        assert client.pttl(mq.keys.queue("c").pump_lock) > 0
        pump.before_trim = None
        report = pump.sweep()["c"]
        assert (report["locked"], report["delivered"]) == (False, 1)
        assert mq.get_job("p", "P").state is JobState.PENDING
        assert client.exists(mq.keys.queue("c").pump_lock) == 0  # dropped after the sweep
    finally:
        client.close()
        server.stop()


KILLED_MID_SWEEP = """
import os, signal, sys
import redis
from echomq_django import EchoMQ
from echomq_django import Pump

def die(queue, actions):
    os.kill(os.getpid(), signal.SIGKILL)  # mid-sweep, holding the lock
Pump(["c"], mq=EchoMQ(redis.Redis.from_url(sys.argv[1])), before_trim=die).sweep()
"""


def test_a_live_pump_takes_over_within_the_lease_of_a_dead_one(r, redis_server, capsys):
    mq = EchoMQ(r, prefix="emq", cross_queue_scripts=False)  # the outbox's path
    _one_cross_completion(mq)
    dead = subprocess.run(
        [sys.executable, "-c", KILLED_MID_SWEEP, redis_server],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    died_at = time.monotonic()
    assert dead.returncode == -9, dead.stderr
    left = r.pttl(mq.keys.queue("c").pump_lock)
    assert 0 < left <= LOCK_MS  # the dead pump's lock: short, and it expires
    peer = Pump(["c"], mq=mq)
    assert peer.sweep()["c"]["locked"] is True
    report = wait_for(lambda: peer.sweep()["c"]["delivered"], what="the peer to deliver")
    took = time.monotonic() - died_at
    with capsys.disabled():
        print(f"\n[pump lock] a live peer delivered {took:.2f} s after its peer died mid-sweep")
    assert report == 1
    assert mq.get_job("p", "P").state is JobState.PENDING
