"""``manage.py runworker --pool async`` as a real subprocess against the
test Redis (docs/howto/async-handlers.md#the-async-pool): a burst runs
``async def`` and sync handlers. The stop rules (SIGTERM lets a running
coroutine finish, a second signal stops at once and leaves the job to its
lease) are tested with the thread pool's, in test_runworker.py."""

from __future__ import annotations

import pytest

from tests.e2e.test_runworker import active, migrated_db, mq, run  # noqa: F401 (fixtures)

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
