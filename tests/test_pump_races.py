"""Kill points and concurrent pumps (issue 4 point 5): exactly-once release
when a pump is SIGKILLed between deliver and trim, and when two pumps sweep
the same outbox at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from echomq_django import EchoMQ, Flow
from echomq_django.runners.pump import Pump

ROOT = Path(__file__).resolve().parent.parent


def wide_cross_flows(mq, parents=20, children=10):
    """``parents`` parents on ``p``, each with ``children`` children on ``c``."""
    mq.add_flows(
        [
            Flow(
                "p",
                "parent",
                {},
                job_id=f"P{i}",
                children=[Flow("c", "child", {}, job_id=f"P{i}-{j}") for j in range(children)],
            )
            for i in range(parents)
        ]
    )


def released_events(mq, queue="p"):
    """How many times each job was released, read from the events stream."""
    counts: dict[str, int] = {}
    for _, fields in mq.client.xrange(mq.keys.queue_key(queue, "events")):
        if fields[b"e"] == b"released":
            job = fields[b"id"].decode()
            counts[job] = counts.get(job, 0) + 1
    return counts


def assert_each_parent_released_once(mq, parents, children):
    assert released_events(mq) == {f"P{i}": 1 for i in range(parents)}
    assert sorted(mq.job_ids("p", "pending")) == sorted(f"P{i}" for i in range(parents))
    for i in range(parents):
        counts = mq.dependency_counts("p", f"P{i}")
        assert (counts["processed"], counts["remaining"]) == (children, 0)
    assert mq.counts("c")["outbox"] == 0


def test_two_pumps_sweeping_one_outbox_release_each_parent_once(mq):
    wide_cross_flows(mq, parents=20, children=10)
    stop = threading.Event()
    errors = []

    def pump_loop():
        pump = Pump(["c"], mq=EchoMQ(mq.client), batch=7)
        try:
            while not stop.is_set():
                pump.sweep()
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=pump_loop) for _ in range(2)]
    for t in threads:
        t.start()
    while jobs := mq.claim("c", 13):
        for job in jobs:
            mq.complete(job, job.id)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    Pump(["c"], mq=mq).sweep()  # whatever the racing pumps left
    assert_each_parent_released_once(mq, parents=20, children=10)


KILLED_PUMP = textwrap.dedent("""
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


@pytest.mark.e2e
def test_pump_killed_between_deliver_and_trim_releases_once(r, redis_server):
    mq = EchoMQ(r)
    wide_cross_flows(mq, parents=5, children=4)
    while jobs := mq.claim("c", 50):
        for job in jobs:
            mq.complete(job, job.id)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_PUMP, redis_server],
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


def test_a_pump_whose_lock_expired_does_not_trim_over_the_new_holder(mq):
    wide_cross_flows(mq, parents=3, children=5)
    while jobs := mq.claim("c", 50):
        for job in jobs:
            mq.complete(job, job.id)
    lock_key = mq.keys.queue_key("c", "pump:lock")

    def lose_lock_mid_sweep(queue, actions):
        mq.client.delete(lock_key)  # as if our lock expired while we delivered
        other = Pump(["c"], mq=EchoMQ(mq.client)).sweep()["c"]
        assert (other["delivered"], other["released"]) == (15, 0)

    report = Pump(["c"], mq=mq, before_trim=lose_lock_mid_sweep).sweep()["c"]
    assert report["lock_lost"] is True and report["delivered"] == 0
    assert_each_parent_released_once(mq, parents=3, children=5)
