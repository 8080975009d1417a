"""Concurrent pumps: two pumps sweeping one outbox release each parent once,
and a pump whose lock expired mid-sweep does not trim over the new holder.
(A pump SIGKILLed between deliver and trim: tests/faults/test_pump_crashes.py.)"""

from __future__ import annotations

import threading

from echomq_django import EchoMQ
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_each_parent_released_once, wide_cross_flows


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
