"""Fair and bounded claims, on both rigs: a queue's concurrency cap (the
setting, and ``set_concurrency`` at run time) counted against its active
jobs in ``claim`` and freed by every way out of active, with the wake
marker back when a job leaves active; the sliding RATE_LIMIT; the checks that
refuse bad values. docs/explanation/protocol.md#concurrency"""

from __future__ import annotations

import threading
import time

import pytest

from echomq_django import EchoMQ, JobState, Worker, handler
from echomq_django.conf.schema import problems
from echomq_django.core.exceptions import JobCancelled
from tests.support.workerapp import jobs as handlers
from tests.support.workerkit import Background, burst, wait_for

CAPPED = {"q": {"CONCURRENCY": 2}}


def ids_of(jobs):
    return [j.id for j in jobs]


def wake_marker(mq, queue="q"):
    return mq.client.zscore(mq.keys.queue_key(queue, "wake"), "0")


def full_mark(mq, queue="q"):
    return mq.client.exists(mq.keys.queue_key(queue, "full"))


def capped(redis_client, clock=None, queues=CAPPED, n=5):
    mq = EchoMQ(redis_client, queues=queues, clock=clock)
    for i in range(n):
        mq.enqueue("q", "n", job_id=f"j{i}")
    return mq


# -- the cap in claim ----------------------------------------------------------


def test_the_cap_holds_for_every_worker_and_idle_ones_sleep(redis_client) -> None:
    a = capped(redis_client)
    b = EchoMQ(redis_client, queues=CAPPED)  # another process, same settings
    assert ids_of(a.claim("q", 1)) == ["j0"]
    assert wake_marker(a) == 0  # one slot left, and work: the next worker wakes
    assert ids_of(b.claim("q", 5)) == ["j1"]  # the cap, not the count asked
    assert (wake_marker(a), full_mark(a)) == (None, 1)  # idle workers block
    refused = b.claim("q", 5)
    assert (list(refused), refused.full, refused.paused, refused.wait_ms) == ([], True, False, None)
    assert (wake_marker(a), a.counts("q")["pending"], a.counts("q")["active"]) == (None, 3, 2)


def test_completion_makes_room_and_wakes_a_worker(redis_client) -> None:
    mq = capped(redis_client)
    first, _ = mq.claim("q", 2)
    assert mq.claim("q", 1).full
    mq.complete(first, "ok")
    assert (wake_marker(mq), full_mark(mq)) == (0, 0)
    assert ids_of(mq.claim("q", 5)) == ["j2"]
    assert (wake_marker(mq), full_mark(mq)) == (None, 1)


def test_a_drained_queue_at_its_cap_sets_no_full_mark(redis_client) -> None:
    mq = capped(redis_client, n=2)
    assert len(mq.claim("q", 5)) == 2
    again = mq.claim("q", 5)
    assert (list(again), again.full, full_mark(mq), wake_marker(mq)) == ([], False, 0, None)


def test_failure_postpone_and_lease_expiry_make_room(redis_client, clock) -> None:
    mq = capped(redis_client, clock=clock, queues={"q": {"CONCURRENCY": 2, "LEASE_MS": 1000}})
    a, _b = mq.claim("q", 2)
    assert mq.claim("q", 1).full
    assert mq.fail(a, "boom") is JobState.DELAYED  # backoff: out of active
    assert (wake_marker(mq), full_mark(mq)) == (0, 0)
    (_c,) = mq.claim("q", 5)
    assert mq.claim("q", 1).full
    clock.advance(1001)  # b's and c's leases expire; the sweep takes them back
    assert mq.timers.recover_stalled("q").recovered == 2
    assert (wake_marker(mq), full_mark(mq), mq.counts("q")["active"]) == (0, 0, 0)
    assert len(mq.claim("q", 5)) == 2


def test_a_cancelled_active_job_makes_room_when_its_worker_reports(redis_client) -> None:
    mq = capped(redis_client, queues={"q": {"CONCURRENCY": 1}})
    (a,) = mq.claim("q", 3)
    assert mq.claim("q", 1).full
    mq.cancel("q", a.id)  # marked: it runs on until its worker hears of it
    assert (full_mark(mq), mq.counts("q")["active"]) == (1, 1)
    with pytest.raises(JobCancelled):
        mq.complete(a, "late")
    assert (wake_marker(mq), full_mark(mq), mq.get_job("q", a.id).state) == (0, 0, JobState.DEAD)
    assert ids_of(mq.claim("q", 3)) == ["j1"]


# -- at run time ------------------------------------------------------------------


def test_set_concurrency_overrides_the_setting_until_dropped(redis_client) -> None:
    mq = capped(redis_client)
    assert mq.limits.concurrency("q") == 2
    mq.limits.set_concurrency("q", 1)
    assert (mq.limits.concurrency("q"), len(mq.claim("q", 5))) == (1, 1)
    assert mq.claim("q", 5).full
    mq.limits.set_concurrency("q", 3)  # raised: the workers wake for the room
    assert (wake_marker(mq), full_mark(mq)) == (0, 0)
    assert len(mq.claim("q", 5)) == 2
    mq.limits.set_concurrency("q", None)  # the setting again: 3 active already, cap 2
    assert (mq.limits.concurrency("q"), mq.claim("q", 5).full) == (2, True)
    assert EchoMQ(redis_client).limits.concurrency("other") is None


def test_a_run_time_cap_needs_no_setting(redis_client) -> None:
    mq = capped(redis_client, queues={})
    mq.limits.set_concurrency("q", 2)
    assert (len(mq.claim("q", 5)), mq.claim("q", 5).full) == (2, True)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, 1_000_001])
def test_a_bad_cap_is_refused_before_any_write(redis_client, bad) -> None:
    mq = EchoMQ(redis_client)
    with pytest.raises(ValueError, match=r"concurrency must be a whole number of jobs from 1 to"):
        mq.limits.set_concurrency("q", bad)
    with pytest.raises(ValueError, match="queue name"):
        mq.limits.set_concurrency("a{b", 2)
    assert redis_client.keys("emq*") == []


# -- workers ------------------------------------------------------------------------

ACTIVE = {"now": 0, "most": 0}
ACTIVE_LOCK = threading.Lock()


@handler("t.counted")
def counted(job):
    """Counts the handlers of this kind running at once (``ACTIVE["most"]``)."""
    with ACTIVE_LOCK:
        ACTIVE["now"] += 1
        ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    time.sleep(0.02)
    with ACTIVE_LOCK:
        ACTIVE["now"] -= 1
    return job.payload


class Counting(EchoMQ):
    """An ``EchoMQ`` that counts its claim calls (the client stays real)."""

    claims = 0

    def claim(self, *args, **kwargs):
        type(self).claims += 1
        return super().claim(*args, **kwargs)


def workers(redis_client, queues, n=2):
    return [
        Background(Worker(["q"], concurrency=8, mq=Counting(redis_client, queues=queues)))
        for _ in range(n)
    ]


def stop(running):
    for bg in running:
        bg.worker.stop()
    for bg in running:
        bg.join()


def test_many_worker_threads_never_run_more_than_the_cap(redis_client) -> None:
    ACTIVE.update(now=0, most=0)
    queues = {"q": {"CONCURRENCY": 3}}
    mq = EchoMQ(redis_client, queues=queues)
    mq.enqueue_many("q", [{"name": "t.counted", "payload": i} for i in range(30)])
    running = workers(redis_client, queues)
    try:
        wait_for(lambda: mq.counts("q")["completed"] == 30, what="30 jobs")
    finally:
        stop(running)
    assert (ACTIVE["most"], mq.counts("q")["active"], full_mark(mq)) == (3, 0, 0)


def test_idle_workers_block_while_the_cap_is_reached(redis_client) -> None:
    """Two workers, a cap of one held by a blocked handler, work waiting: the
    idle threads make no claim until the held job finishes (no spinning)."""
    handlers.RELEASE.clear()
    queues = {"q": {"CONCURRENCY": 1}}
    mq = EchoMQ(redis_client, queues=queues)
    mq.enqueue("q", "t.block", job_id="held")
    for i in range(3):
        mq.enqueue("q", "t.echo", i, job_id=f"e{i}")
    Counting.claims = 0
    running = workers(redis_client, queues)
    try:
        # each worker's first claim (a waker may have popped the first
        # marker too: one more), then quiet
        wait_for(lambda: Counting.claims >= 2 and full_mark(mq), what="the cap to be reached")
        time.sleep(0.3)
        before = Counting.claims
        time.sleep(0.5)  # both workers idle meanwhile: neither may claim again
        assert (Counting.claims - before, mq.counts("q")["pending"]) == (0, 3)
        handlers.RELEASE.set()
        wait_for(lambda: mq.counts("q")["completed"] == 4, what="the four jobs")
    finally:
        handlers.RELEASE.set()
        stop(running)
    assert (mq.get_job("q", "held").state, full_mark(mq)) == (JobState.COMPLETED, 0)


def test_a_burst_worker_runs_every_job_under_a_cap_of_one(redis_client) -> None:
    mq = EchoMQ(redis_client, queues={"q": {"CONCURRENCY": 1}})
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"e{i}")
    _worker, processed = burst(mq, ["q"], concurrency=4)
    assert (processed, mq.counts("q")["completed"]) == (5, 5)


# -- the sliding rate limit -----------------------------------------------------------

SLIDING = {"q": {"RATE_LIMIT": {"MAX": 3, "PER_MS": 1000, "MODE": "sliding"}}}


def test_a_sliding_window_counts_the_last_per_ms_for_all_workers(redis_client, clock) -> None:
    a = capped(redis_client, clock=clock, queues=SLIDING, n=8)
    b = EchoMQ(redis_client, queues=SLIDING, clock=clock)
    assert ids_of(a.claim("q", 2)) == ["j0", "j1"]
    clock.advance(100)
    assert ids_of(b.claim("q", 5)) == ["j2"]
    assert a.claim("q", 5).wait_ms == 900  # until j0 and j1 are a window old
    clock.advance(900)
    # a fixed window would give three here: j2 started 900 ms ago and still counts
    assert ids_of(b.claim("q", 5)) == ["j3", "j4"]
    # refused claims take turns over the starts that will leave (j2 at 100,
    # j3 and j4 at 1000): not every idle worker wakes for the first one; the
    # claim above reset the turns, so the first waits for the oldest
    assert [b.claim("q", 1).wait_ms for _ in range(3)] == [100, 1000, 1000]
    clock.advance(100)
    assert ids_of(b.claim("q", 5)) == ["j5"]
    log = a.keys.queue_key("q", "limiter:log")
    assert (redis_client.zcard(log), 0 < redis_client.pttl(log) <= 1000) == (3, True)


def test_no_interval_of_per_ms_starts_more_than_max(redis_client, clock) -> None:
    import random

    rng = random.Random(7)
    mq = capped(redis_client, clock=clock, queues=SLIDING, n=60)
    starts = []
    while len(starts) < 40:
        got = mq.claim("q", rng.randint(1, 4))
        starts += [clock.now] * len(got)
        clock.advance(got.wait_ms if got.wait_ms and rng.random() < 0.5 else rng.randint(1, 400))
    worst = max(sum(1 for t in starts if s <= t < s + 1000) for s in starts)
    assert worst == 3
    assert redis_client.zcard(mq.keys.queue_key("q", "limiter:log")) <= 3


def test_a_host_whose_clock_reads_earlier_cannot_reopen_the_window(redis_client) -> None:
    """Two hosts 1005 ms apart (or one claim whose clock was read before
    another's ran): the log's time only moves forward, so the later-running,
    earlier-reading claim counts what the other just started and trims
    nothing that still counts."""
    from tests.support.workerkit import Clock

    behind, ahead = Clock(), Clock()
    ahead.advance(1005)
    b = capped(redis_client, clock=behind, queues=SLIDING, n=9)
    a = EchoMQ(redis_client, queues=SLIDING, clock=ahead)
    assert len(b.claim("q", 3)) == 3  # three starts at T
    assert len(a.claim("q", 1)) == 1  # at T+1005: T's starts are a window old
    behind.advance(999)
    assert len(b.claim("q", 5)) == 2  # at T+999 by its clock, T+1005 by the log's
    starts = sorted(b.get_job("q", f"j{i}").started_at for i in range(6))
    t0 = starts[0]
    assert [t - t0 for t in starts] == [0, 0, 0, 1005, 1005, 1005]


def test_the_fixed_window_stays_the_default(redis_client, clock) -> None:
    fixed = {"q": {"RATE_LIMIT": {"MAX": 3, "PER_MS": 1000}}}
    mq = capped(redis_client, clock=clock, queues=fixed, n=8)
    assert len(mq.claim("q", 2)) == 2
    clock.advance(900)
    assert len(mq.claim("q", 5)) == 1
    clock.advance(100)
    assert len(mq.claim("q", 5)) == 3  # a new window: all three again
    assert not redis_client.exists(mq.keys.queue_key("q", "limiter:log"))


# -- checks -----------------------------------------------------------------------------


def ids(cfg):
    return [(cid, message) for cid, message, _hint in problems(cfg)]


@pytest.mark.parametrize("bad", [0, -2, "3", 2.5, True])
def test_a_bad_concurrency_setting_is_e018(bad) -> None:
    cfg = {"URL": "redis://localhost/0", "QUEUES": {"api": {"CONCURRENCY": bad}}}
    assert ids(cfg) == [
        (
            "echomq_django.E018",
            f"queue 'api': concurrency must be a whole number of jobs from 1 to 1000000, got "
            f"{bad!r}",
        )
    ]


def test_rate_limit_modes_are_checked() -> None:
    from echomq_django.runners.periodic import problems as scheduling

    def found(rl):
        return [cid for cid, _m, _h in scheduling({"QUEUES": {"q": {"RATE_LIMIT": rl}}})]

    assert found({"MAX": 5, "PER_MS": 1000, "MODE": "sliding"}) == []
    assert found({"MAX": 5, "PER_MS": 1000, "MODE": "fixed"}) == []
    assert found({"MAX": 5, "PER_MS": 1000, "MODE": "gcra"}) == ["echomq_django.E050"]
    assert found({"MAX": 5, "MODE": "sliding"}) == ["echomq_django.E050"]
    assert found({"MAX": 100_001, "PER_MS": 1000, "MODE": "sliding"}) == ["echomq_django.E059"]
    assert found({"MAX": 100_001, "PER_MS": 1000}) == []
