"""Lifecycle with real workers, pumps and the admin mirror: a cancel reaches a
running handler, retention runs in the pump's sweep and the worker's timers,
and the mirror follows removals."""

from __future__ import annotations

import threading

import pytest

from echomq_django import EchoMQ, Flow, Pump, Worker
from echomq_django.models import MirroredJob
from echomq_django.monitoring.mirror import mirror_after_sweep
from tests.support.jobkit import assert_state
from tests.support.workerkit import wait_for


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
    # x's worker delivers it to p and runs p (no-polling.md#a-released-parent-starts-at-once)
    assert Worker(["q", "other"], concurrency=2, mq=mq).run(burst=True) == 7
    pump = Pump(["q", "other"], mq=mq, after_sweep=[mirror_after_sweep])
    reports = pump.sweep()
    assert reports["other"]["delivered"] == 0
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


@pytest.mark.django_db(transaction=True)
def test_retention_drops_a_block_under_one_removed_event_and_the_mirror_follows_it(r) -> None:
    """Retention removes a block of rows with one command of each kind and
    names the block in one ``removed`` entry (ids space-separated); the
    mirror's incremental pass reads it and deletes exactly those rows."""
    from echomq_django.monitoring.mirror import mirror_queue

    mq = EchoMQ(r, queues={"q": {"KEEP_COMPLETED": 2}})
    for i in range(6):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    Worker(["q"], concurrency=1, mq=mq).run(burst=True)
    assert mirror_queue(mq, "q")["full"]  # the first pass reads everything
    assert MirroredJob.objects.filter(queue="q").count() == 6

    report = mq.lifecycle.prune("q")

    assert (report.removed, report.more) == (4, False)
    removed = [
        f[b"id"].decode()
        for _, f in r.xrange(mq.keys.queue_key("q", "events"))
        if f[b"e"] == b"removed"
    ]
    assert removed == ["j0 j1 j2 j3"]
    assert mq.job_ids("q", "completed") == ["j4", "j5"]
    assert [r.exists(mq.keys.job("q", f"j{i}")) for i in range(6)] == [0, 0, 0, 0, 1, 1]
    passed = mirror_queue(mq, "q")
    assert (passed["full"], passed["events"]) == (False, 4)  # one entry, four ids
    mirrored = MirroredJob.objects.filter(queue="q").values_list("job_id", flat=True)
    assert sorted(mirrored) == ["j4", "j5"]
