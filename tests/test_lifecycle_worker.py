"""Lifecycle with real workers, pumps and the admin mirror (DESIGN §10.2,
issue 13): a cancel reaches a running handler, retention runs in the pump's
sweep and the worker's timers, and the mirror follows removals."""

from __future__ import annotations

import threading

import pytest

from echomq_django import EchoMQ, Flow, Pump, Worker
from echomq_django.mirror import mirror_after_sweep
from echomq_django.models import MirroredJob
from tests.jobkit import assert_state
from tests.workerkit import wait_for


def test_a_running_handler_learns_its_cancel(r) -> None:
    mq = EchoMQ(r)
    mq.enqueue("q", "t.until_cancelled", None, job_id="long")
    worker = Worker(["q"], concurrency=1, mq=mq, lease_ms=300, heartbeat_ms=20)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: mq.get_job("q", "long").state == "active", what="the claim")
        assert mq.cancel("q", "long").state == "active"
        wait_for(lambda: mq.get_job("q", "long").state == "dead", what="the death")
    finally:
        worker.stop()
        thread.join(10)
    row = assert_state(mq, "q", "long", "dead")
    assert (row["error"], row.get("result")) == ("cancelled", None)  # the result was dropped
    assert worker.stats["completed"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_pump_prunes_and_the_mirror_follows(r) -> None:
    mq = EchoMQ(r, queues={"q": {"KEEP_COMPLETED": 2, "KEEP_DEAD": 0}})
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    mq.add_flow(Flow("q", "t.echo", "p", job_id="p", children=[
        Flow("other", "t.echo", "x", job_id="x")]))  # fmt: skip
    Worker(["q", "other"], concurrency=2, mq=mq).run(burst=True)
    pump = Pump(["q", "other"], mq=mq, after_sweep=[mirror_after_sweep])
    pump.sweep()  # delivers x to p
    Worker(["q"], concurrency=1, mq=mq).run(burst=True)  # p completes
    reports = pump.sweep()
    assert reports["q"]["pruned"] >= 1
    pump.sweep()
    assert len(mq.job_ids("q", "completed")) == 2
    mirrored = set(MirroredJob.objects.filter(queue="q").values_list("job_id", flat=True))
    assert mirrored == set(mq.job_ids("q", "completed"))
    mq.remove("q", mq.job_ids("q", "completed")[0])
    pump.sweep()
    assert set(MirroredJob.objects.filter(queue="q").values_list("job_id", flat=True)) == set(
        mq.job_ids("q", "completed")
    )
