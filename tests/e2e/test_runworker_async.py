"""``manage.py runworker --pool async`` as a real subprocess against the
test Redis (docs/howto/async-handlers.md#the-async-pool): a burst runs
``async def`` and sync handlers, SIGTERM lets a running coroutine finish,
a second signal stops at once and leaves the job to its lease."""

from __future__ import annotations

import signal

import pytest

from echomq_django import JobState
from tests.e2e.test_runworker import active, migrated_db, mq, run  # noqa: F401 (fixtures)
from tests.support.workerkit import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("subprocess_db")]


def test_a_burst_on_the_async_pool_runs_async_and_sync_handlers(run, mq):  # noqa: F811
    for i in range(6):
        mq.enqueue("q", "t.async_echo", i, job_id=f"a{i}")
    mq.enqueue("q", "t.echo", "sync", job_id="s")
    worker = run("runworker", "q", "--burst", "--pool", "async", "--concurrency", "4")
    assert worker.wait() == 0, worker.stderr()
    assert [mq.get_job("q", f"a{i}").result for i in range(6)] == [{"echo": i} for i in range(6)]
    assert mq.get_job("q", "s").result == "sync"
    assert "concurrency 4 (async pool)" in worker.stderr()


def test_sigterm_lets_the_running_coroutine_finish_and_exits_0(run, mq):  # noqa: F811
    mq.enqueue("q", "t.async_sleep", 1.0, job_id="s")
    worker = run("runworker", "q", "--pool", "async")
    wait_for(lambda: active(mq, "s"), what="the claim")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr()
    job = mq.get_job("q", "s")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 1.0, 1)
    assert (
        "SIGTERM: no more claims; finishing 1 running jobs (up to 30s); send it again to "
        "stop at once"
    ) in worker.stderr()


def test_a_second_signal_stops_at_once_leaving_the_lease(run, mq):  # noqa: F811
    mq.enqueue("q", "t.async_sleep", 20.0, job_id="s")
    worker = run("runworker", "q", "--pool", "async")
    wait_for(lambda: active(mq, "s"), what="the claim")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: no more claims" in worker.stderr(), what="the first stop")
    worker.signal(signal.SIGINT)
    assert worker.wait() == 1
    assert worker.stderr().splitlines()[-1] == (
        "runworker: stopped with 1 jobs still running; their leases will expire and the pump "
        "recovers them"
    )
    assert active(mq, "s")
