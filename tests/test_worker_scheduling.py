"""The worker's side of DESIGN §10.3 (issue 16), on both rigs: time limits
(a timed-out attempt fails and retries, its thread is written off and
replaced, its late result discarded; too many stuck threads stop the worker),
``RateLimited`` from a handler, a full ``RATE_LIMIT`` window and a paused
queue, and the pump's children-timeout sweep and periodic jobs."""

from __future__ import annotations

import pytest

from echomq_django import EchoMQ, JobState, Worker
from echomq_django.runners.periodic import Entry, Scheduler
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, leaf, node
from tests.support.workerapp import jobs as handlers
from tests.support.workerkit import Background, burst, wait_for


@pytest.fixture(autouse=True)
def _fresh_handlers():
    handlers.RELEASE.clear()
    handlers.SEEN.clear()
    handlers.LIMITED.clear()
    yield
    handlers.RELEASE.set()  # never leave a handler thread blocked


def state(mq, job_id, queue="q"):
    return mq.get_job(queue, job_id).state


def test_a_timed_out_attempt_fails_retries_and_its_thread_is_replaced(mq) -> None:
    mq.enqueue("q", "t.block", job_id="b", timeout_ms=100, max_attempts=2, backoff_ms=0)
    worker = Worker(["q"], concurrency=2, mq=mq, poll_interval=0.02)
    bg = Background(worker)
    wait_for(lambda: state(mq, "b") is JobState.DEAD, what="two timed-out attempts")
    job = mq.get_job("q", "b")
    assert (job.attempts, job.error) == (
        2,
        "TimeoutError: the attempt ran longer than its time limit of 100 ms "
        "(timeout_ms / TIMEOUT_MS); the handler's late result is discarded",
    )
    assert worker._timeouts.stuck == 2  # both threads still blocked: written off
    for i in range(4):  # capacity kept: two fresh threads run these
        mq.enqueue("q", "t.echo", i, job_id=f"e{i}")
    wait_for(lambda: mq.counts("q")["completed"] == 4, what="the echo jobs")
    handlers.RELEASE.set()
    wait_for(lambda: worker._timeouts.stuck == 0, what="the stuck handlers to return")
    assert sorted(handlers.SEEN) == [("b", True), ("b", True)]
    assert_state(mq, "q", "b", "dead")  # the late result was discarded
    # a returning stuck thread leaves the pool just after it stops counting as
    # stuck: the pool is back to its two threads within a moment, not at once
    wait_for(lambda: len(worker._pool._threads) == 2, what="the pool back to its 2 threads")
    worker.stop()
    bg.join()
    assert worker.stats == {"completed": 4, "failed": 1, "dead": 1, "lost": 0, "postponed": 0}


def test_more_stuck_threads_than_max_stuck_stop_the_worker(redis_client) -> None:
    mq = EchoMQ(redis_client, queues={"q": {"TIMEOUT_MS": 50}})
    for i in range(2):
        mq.enqueue("q", "t.block", job_id=f"b{i}", max_attempts=1)
    worker = Worker(["q"], concurrency=1, mq=mq, poll_interval=0.02, max_stuck=1)
    assert Background(worker).join() == 2  # returned on its own after the second
    assert [state(mq, f"b{i}") for i in range(2)] == [JobState.DEAD] * 2
    assert mq.get_job("q", "b1").error.startswith("TimeoutError: the attempt ran longer than "
                                                  "its time limit of 50 ms")  # fmt: skip


def test_rate_limited_puts_the_job_back_without_spending_an_attempt(mq) -> None:
    # retry after 1 s: the burst worker's timers promote a due delayed job, so a
    # shorter wait raced the burst's end on a slow run (it ran the job again)
    mq.enqueue("q", "t.rate_limited", 1000, job_id="r", max_attempts=1)
    worker, processed = burst(mq, ["q"])
    assert (processed, worker.stats["postponed"]) == (0, 1)
    job = mq.get_job("q", "r")
    assert (job.state, job.attempts) == (JobState.DELAYED, 0)
    wait_for(lambda: mq.timers.promote_delayed("q"), what="the retry-after to pass")
    worker, processed = burst(mq, ["q"])
    job = mq.get_job("q", "r")
    assert (processed, job.state, job.result, job.attempts) == (1, JobState.COMPLETED, 1, 1)


def test_a_full_rate_window_stops_claims_for_every_worker(redis_client) -> None:
    limits = {"q": {"RATE_LIMIT": {"MAX": 2, "PER_MS": 60_000}}}
    mq = EchoMQ(redis_client, queues=limits)
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    assert burst(mq, ["q"])[1] == 2
    assert burst(EchoMQ(redis_client, queues=limits), ["q"])[1] == 0  # another process
    assert mq.counts("q")["pending"] == 3


def test_a_worker_claims_nothing_from_a_paused_queue(mq) -> None:
    for i in range(3):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    mq.pause("q")
    assert burst(mq, ["q"])[1] == 0
    mq.resume("q")
    assert burst(mq, ["q"])[1] == 3


def test_the_pump_expires_children_and_fires_periodic_jobs(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c")], children_timeout_ms=100))
    scheduler = Scheduler(tmq, [Entry(key="beat", name="t.echo", queue="q", every_s=60)])
    pump = Pump(["q"], mq=tmq, scheduler=scheduler)
    pump.sweep()
    clock.now = scheduler.next_due()
    report = pump.sweep()["q"]
    assert (report["expired"], report["scheduled"]) == (1, 1)
    assert_state(tmq, "q", "p", "dead")
    assert_state(tmq, "q", f"beat-{clock.now}", "pending")


def test_the_module_api_over_the_settings_connection(r) -> None:
    import echomq_django as emq
    from echomq_django import conf

    conf.reset()
    try:
        assert emq.enqueue("q", "t.echo", 1, job_id="a", dedup_key="k", on_commit=False) == "a"
        assert emq.enqueue("q", "t.echo", 2, dedup_key="k", on_commit=False) == "a"
        emq.enqueue("q", "t.echo", 3, job_id="b", priority=4, timeout_ms=50, on_commit=False)
        assert (emq.pause("q"), emq.is_paused("q"), emq.resume("q")) == (True, True, True)
        emq.add_flow(node("p", [leaf("c1"), leaf("c2")]), on_commit=False)
        mq = conf.get_mq()
        assert emq.remove_child_dependency("q", "p", mq.keys.job("q", "c1")).released == []
        deleted, outcome = emq.remove_unprocessed_children("q", "p")
        assert (deleted, outcome.released) == ([("q", "c2")], [("q", "p")])
        job = mq.claim("q", 1)[0]
        assert (job.id, job.priority, job.timeout_ms) == ("b", 4, 50)
    finally:
        conf.reset()


def test_a_pump_fires_the_settings_entries_of_its_own_queues(tmq, settings) -> None:
    beat = {"name": "t.echo", "every_s": 60}
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "SCHEDULE": {"mine": {**beat, "queue": "q"}, "theirs": {**beat, "queue": "other"}},
    }
    pump = Pump(["q"], mq=tmq)
    assert [e.key for e in pump.scheduler.entries] == ["mine"]
    settings.ECHOMQ = {k: v for k, v in settings.ECHOMQ.items() if k != "SCHEDULE"}
    assert Pump(["q"], mq=tmq).scheduler is None


def test_stats_list_the_periodic_jobs(tmq, clock, settings) -> None:
    from echomq_django.monitoring.stats import collect, render

    entry = {"name": "t.echo", "queue": "orders", "every_s": 60}
    settings.ECHOMQ = {**settings.ECHOMQ, "SCHEDULE": {"beat": entry}}
    Pump(["orders"], mq=tmq).sweep()  # the first start sets the mark
    tick = clock.now - clock.now % 60_000
    doc = collect(tmq, ["orders"])
    assert doc["schedule"] == [
        {
            "entry": "beat",
            "name": "t.echo",
            "queue": "orders",
            "schedule": "every 60 s",
            "last_tick": tick,
            "next_tick": tick + 60_000,
        }
    ]
    assert "beat   orders  t.echo  every 60 s   20 s ago     40 s" in render(doc).splitlines()
