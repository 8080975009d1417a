"""What holds a worker back, on both rigs: a time limit (a timed-out attempt
fails and retries, its thread is written off and replaced, its late result
discarded; too many stuck threads stop the worker), ``RateLimited`` from a
handler, a full ``RATE_LIMIT`` window and a paused queue."""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time

import pytest

from echomq_django import EchoMQ, JobState, Worker
from tests.support.jobkit import assert_state
from tests.support.workerapp import jobs as handlers
from tests.support.workerkit import Background, burst, wait_for


@pytest.fixture(autouse=True)
def _fresh_handlers():
    handlers.RELEASE.clear()
    handlers.SEEN.clear()
    handlers.LIMITED.clear()
    yield
    handlers.RELEASE.set()  # never leave a handler thread blocked


def seen(job_id):
    """What ``t.block`` handlers of ``job_id`` saw (another test's may return late)."""
    return [x for x in handlers.SEEN if x[0] == job_id]


def state(mq, job_id, queue="q"):
    return mq.get_job(queue, job_id).state


def test_a_timed_out_attempt_fails_retries_and_its_thread_is_replaced(mq, caplog) -> None:
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
    assert worker.loop.timeouts.stuck == 2  # both threads still blocked: written off
    for i in range(4):  # capacity kept: two fresh threads run these
        mq.enqueue("q", "t.echo", i, job_id=f"e{i}")
    wait_for(lambda: mq.counts("q")["completed"] == 4, what="the echo jobs")
    with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
        handlers.RELEASE.set()
        wait_for(lambda: worker.loop.timeouts.stuck == 0, what="the stuck handlers to return")
    assert sorted(handlers.SEEN) == [("b", True), ("b", True)]
    late = [
        re.fullmatch(
            r"job q/b \(t\.block\): the handler returned (\d+) ms after its time limit of "
            r"100 ms \(it ran (\d+) ms\); its result is discarded",
            r.getMessage(),
        )
        for r in caplog.records
        if "after its time limit" in r.getMessage()
    ]
    assert len(late) == 2 and all(late)
    for m in late:  # the overrun, not the run time
        assert abs(int(m.group(1)) - (int(m.group(2)) - 100)) <= 1
    assert_state(mq, "q", "b", "dead")  # the late result was discarded
    # a returning stuck thread leaves the pool just after it stops counting as
    # stuck: the pool is back to its two threads within a moment, not at once
    wait_for(lambda: len(worker.loop.pool._threads) == 2, what="the pool back to its 2 threads")
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


def test_a_stop_waits_for_a_written_off_handler_within_the_shutdown_timeout(mq) -> None:
    """SIGTERM's rule (docs/explanation/reliability.md#stopping-a-worker): a
    handler past its time limit was failed and written off, but its side
    effects still run; a graceful stop waits for it like any running handler
    (it used to return at once, and the process exit cut the handler off)."""
    jid = "w" + secrets.token_hex(4)  # a late handler of another test may return
    mq.enqueue("q", "t.block", job_id=jid, timeout_ms=50, max_attempts=1)
    worker = Worker(["q"], concurrency=1, mq=mq, poll_interval=0.02, shutdown_timeout=60)
    bg = Background(worker)
    wait_for(lambda: state(mq, jid) is JobState.DEAD, what="the attempt to time out")
    assert worker.loop.timeouts.stuck == 1
    worker.stop()  # what SIGTERM calls
    bg.thread.join(0.5)
    assert bg.thread.is_alive() and seen(jid) == []  # still waiting for the handler
    handlers.RELEASE.set()
    bg.join()
    assert (seen(jid), worker.loop.timeouts.stuck) == ([(jid, True)], 0)
    assert mq.get_job("q", jid).result is None  # its late result is still discarded


def test_a_stop_gives_up_on_a_written_off_handler_at_the_shutdown_timeout(mq, caplog) -> None:
    jid = "g" + secrets.token_hex(4)  # a late handler of another test may return
    mq.enqueue("q", "t.block", job_id=jid, timeout_ms=50, max_attempts=1)
    worker = Worker(["q"], concurrency=1, mq=mq, poll_interval=0.02, shutdown_timeout=0.2)
    bg = Background(worker)
    wait_for(lambda: worker.loop.timeouts.stuck == 1, what="the attempt to time out")
    with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
        worker.stop()
        bg.join()
    assert (seen(jid), worker.left_running) == ([], 1)  # given up on: never released
    assert (
        "stopped with 1 handlers past their time limit still running (their jobs were "
        "failed as timed out); exiting now cuts them off"
    ) in [r.getMessage() for r in caplog.records]


def test_a_burst_run_waits_for_its_written_off_handler(mq) -> None:
    jid = "u" + secrets.token_hex(4)  # a late handler of another test may return
    mq.enqueue("q", "t.block", job_id=jid, timeout_ms=50, max_attempts=1)
    worker = Worker(["q"], concurrency=1, mq=mq, poll_interval=0.02, shutdown_timeout=60)
    bg = Background(worker, burst=True)
    wait_for(lambda: worker.loop.stopping.is_set(), what="the burst's end to become a stop")
    assert (worker.loop.timeouts.stuck, seen(jid)) == (1, [])
    handlers.RELEASE.set()
    assert bg.join() == 1
    assert seen(jid) == [(jid, True)]


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
    assert len(mq.claim("q", 5)) == 2
    other = EchoMQ(redis_client, queues=limits).claim("q", 5)  # another process
    assert (len(other), 0 < other.wait_ms <= 60_000) == (0, True)
    assert mq.counts("q")["pending"] == 3


def test_a_full_window_with_nothing_claimable_is_no_wait(redis_client) -> None:
    """A full window on an empty queue answers an empty claim, not a wait:
    nothing would be claimable when it reopens (a burst ends at once)."""
    mq = EchoMQ(redis_client, queues={"q": {"RATE_LIMIT": {"MAX": 1, "PER_MS": 60_000}}})
    mq.enqueue("q", "t.echo", 1, job_id="j")
    assert len(mq.claim("q", 1)) == 1
    empty = mq.claim("q", 1)
    assert (len(empty), empty.wait_ms, empty.paused) == (0, None, False)
    worker, processed = burst(mq, ["q"])
    assert (processed, worker.loop.window_waits) == (0, 0)


def test_burst_waits_out_a_full_rate_window_and_runs_every_job(redis_client) -> None:
    """Burst runs "until no job is pending or due": a queue resting on a full
    RATE_LIMIT window keeps it alive, and it blocks until the window reopens
    (one claim per window, no polling). docs/howto/testing.md#runworker---burst-in-scripts-and-ci"""
    mq = EchoMQ(redis_client, queues={"q": {"RATE_LIMIT": {"MAX": 5, "PER_MS": 400}}})
    for i in range(15):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    worker, processed = burst(mq, ["q"], concurrency=4)
    assert (processed, mq.counts("q")["completed"], mq.counts("q")["pending"]) == (15, 15, 0)
    # 15 jobs at 5 a window: two windows were full with jobs left (a poller
    # would count hundreds); on a loaded machine a wait that woke early, or a
    # handler slot freed before the window turned, may meet a full window again
    assert 1 <= worker.loop.window_waits <= 6


def test_a_worker_claims_nothing_from_a_paused_queue(mq) -> None:
    """A paused queue's pending jobs do not keep a burst alive
    (docs/howto/testing.md#runworker---burst-in-scripts-and-ci): it returns 0 at once."""
    for i in range(3):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    mq.pause("q")
    assert burst(mq, ["q"])[1] == 0
    mq.resume("q")
    assert burst(mq, ["q"])[1] == 3


def test_a_worker_s_handler_threads_start_on_their_own_thread_at_its_first_job(mq) -> None:
    """The thread pool starts no thread until a job arrives, then all of them
    on a thread of their own (the loop hands its first jobs over without
    waiting for each start); they are daemons only when the thread that ran
    the worker is one; a pool shut while it starts them leaves none behind."""
    from echomq_django.runners.pool import HandlerPool

    worker = Worker(["q"], mq=mq, concurrency=4, block_timeout=0.2)
    bg = Background(worker)
    wait_for(lambda: worker.loop.pool is not None, what="the worker's pool")
    pool = worker.loop.pool
    time.sleep(0.1)
    assert pool._threads == []  # no job yet
    mq.enqueue("q", "t.echo", 1, job_id="first")
    wait_for(lambda: len(pool._threads) == 4, what="the pool's 4 threads")
    wait_for(lambda: mq.counts("q")["completed"] == 1, what="the first job")
    assert sorted(t.name for t in pool._threads) == [f"echomq-worker_{i}" for i in range(4)]
    assert {t.daemon for t in pool._threads} == {bg.thread.daemon}
    worker.stop()
    bg.join()
    assert pool._threads == []  # every one left at the shutdown
    made_here = HandlerPool(2, "here", lambda *a: None)
    made_here.submit(lambda: None)
    wait_for(lambda: len(made_here._threads) == 2, what="two threads")
    assert [t.daemon for t in made_here._threads] == [False, False]  # as the main thread
    made_here.shutdown(wait=True)
    shut = HandlerPool(64, "shut-at-once", lambda *a: None)
    for _ in range(64):
        shut.submit(lambda: None)
    shut.shutdown(wait=True)
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("shut-at-once_")],
        what="no thread of a pool shut as it started",
    )
    assert shut._threads == []
