"""The async pool (``Worker(pool="async")``, ``runworker --pool async``)."""

from __future__ import annotations

from echomq_django import JobState
from tests.support.workerkit import burst


def test_smoke(mq):
    for i in range(5):
        mq.enqueue("q", "t.async_echo", {"n": i}, job_id=f"ok{i}")
    mq.enqueue("q", "t.async_fail", None, job_id="bad", max_attempts=1)
    mq.enqueue("q", "t.echo", 7, job_id="sync")
    worker, processed = burst(mq, ["q"], concurrency=3, pool="async")
    assert processed == 7
    bad = mq.get_job("q", "bad")
    print(bad.error)
    assert mq.get_job("q", "sync").result == 7
    assert worker.stats == {"completed": 6, "failed": 0, "dead": 1, "lost": 0, "postponed": 0}
    assert bad.state is JobState.DEAD
