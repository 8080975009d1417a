"""The slot a worker holds for the claim riding a child's completion
(docs/explanation/no-polling.md#a-released-parent-starts-at-once) comes back
however the run ends: a forced stop while the reporter is still busy with an
earlier batch leaves no slot held for the next run, which claims with every
handler and ends its burst; flows whose children fail, are retried, rate
limited or die drain on each pool with one to three handlers and leave no
slot held, the worker blocked on the wake keys (its blocking timeout and
sweep far longer than any test waits); ``max_jobs`` ends a run while flows
drain, having claimed exactly that many, and a stop mid-drain leaves nothing
claimed or held, on each pool."""

from __future__ import annotations

import threading
import time

import pytest

from echomq_django import Flow, JobState, Worker, signals
from tests.support.workerkit import Background, wait_for

NEVER = 3600.0  # s: a blocking timeout and a sweep interval no test waits for


def idle_worker(mq, queues=("q",), **kw) -> Worker:
    options = {"block_timeout": NEVER, "sweep_interval": NEVER, "register": False, **kw}
    return Worker(list(queues), mq=mq, **options)


def test_a_forced_stop_while_a_ride_is_held_leaves_no_slot_held(mq) -> None:
    gate, entered = threading.Event(), threading.Event()

    def slow(sender, **kw):  # the reporter's batch of the failed job waits here
        entered.set()
        gate.wait(30)

    signals.job_failed.connect(slow, weak=False)
    try:
        worker = idle_worker(mq, concurrency=2)
        bg = Background(worker)
        wait_for(lambda: worker.waiting, what="the worker blocking")
        mq.enqueue("q", "t.fail", job_id="f", max_attempts=3, backoff_ms=3_600_000)
        wait_for(entered.is_set, what="the reporter busy with the failed job")
        kid = Flow("q", "t.echo", 2, job_id="c")
        mq.add_flow(Flow("q", "t.echo", 1, job_id="p", children=[kid]))
        wait_for(lambda: worker.loop.ride_held is not None, what="a slot held for the ride")
        worker.stop(force=True)
        bg.join()
    finally:
        gate.set()
        signals.job_failed.disconnect(slow)
    reporter = [t for t in threading.enumerate() if t.name == "echomq-reporter"]
    for thread in reporter:
        thread.join(10)
    # the next run: "c" is still active on its lease, "p" waits for it: the burst ends
    again = Background(worker, burst=True)
    assert again.join(20) == 0
    assert worker.loop.fetching == 0 and worker.loop.ride_held is None
    assert mq.get_job("q", "p").state is JobState.AWAITING_CHILDREN


def mixed_flows(mq, rounds: int, parent_queue: str = "q") -> list[tuple[str, str]]:
    """Flows whose children on "q" succeed, fail once (retried after 5 ms),
    are rate limited once (back in 5 ms), or (a parent on "q") die and are
    ignored: a dead child's release of a parent on another queue waits for
    a sweep (the worker delivers its completions only), which never comes here."""
    parents = []
    for n in range(rounds):
        kids = [Flow("q", "t.echo", i) for i in range(4)]
        kids += [Flow("q", "t.flaky", {"fail_times": 1}, max_attempts=2, backoff_ms=5)]
        kids += [Flow("q", "t.rate_limited", 5, job_id=f"rl{parent_queue}{n}")]
        if parent_queue == "q":
            kids += [Flow("q", "t.unrecoverable", ignore_dependency_on_failure=True)]
        mq.add_flow(Flow(parent_queue, "t.echo", n, job_id=f"p{n}", children=kids))
        parents.append((parent_queue, f"p{n}"))
    return parents


@pytest.mark.parametrize("pool,concurrency", [("thread", 1), ("thread", 3), ("async", 2)])
@pytest.mark.parametrize("parent_queue", ["q", "r"])
def test_flows_whose_children_fail_and_postpone_end_with_no_slot_held(
    mq, pool, concurrency, parent_queue
) -> None:
    worker = idle_worker(mq, ("q", "r"), concurrency=concurrency, pool=pool)
    bg = Background(worker)
    try:
        wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking")
        parents = mixed_flows(mq, 8, parent_queue)
        left = lambda: [p for p in parents if mq.get_job(*p).state is not JobState.COMPLETED]  # noqa: E731
        try:
            wait_for(lambda: not left(), timeout=30, what="every parent")
        except AssertionError:
            raise AssertionError(
                f"left: {left()[:2]}; q: {mq.counts('q')}; wakeups {worker.wakeups}; "
                f"fetching {worker.loop.fetching}, held {worker.loop.ride_held}, "
                f"executing {worker.loop.executing}, waiting {worker.waiting}"
            ) from None
        wait_for(lambda: worker.waiting, timeout=30, what="the worker blocking again")
        # a parent its handler thread reported itself (the direct path) gives its
        # slot back just after Redis shows it completed: the loop's count follows
        state = lambda: (worker.loop.fetching, worker.loop.ride_held, worker.loop.executing)  # noqa: E731
        wait_for(lambda: state() == (0, None, 0), timeout=10, what="no slot held, none running")
    finally:
        worker.stop()
        bg.join(60)
    mq.enqueue("q", "t.echo", 1, job_id="after")  # the next run claims, and its burst ends
    assert Background(worker, burst=True).join(30) == 1
    assert (worker.loop.fetching, worker.loop.ride_held) == (0, None)


@pytest.mark.parametrize(
    "pool,concurrency", [("thread", 1), ("thread", 3), ("process", 2), ("async", 3)]
)
@pytest.mark.parametrize("max_jobs", [1, 2, 5, 9])
def test_max_jobs_ends_a_run_while_flows_drain(mq, pool, concurrency, max_jobs) -> None:
    for n in range(3):  # a parent and two children each, on the worker's queue
        kids = [Flow("q", "t.echo", i, job_id=f"c{n}-{i}") for i in range(2)]
        mq.add_flow(Flow("q", "t.echo", n, job_id=f"p{n}", children=kids))
    worker = idle_worker(mq, concurrency=concurrency, pool=pool)
    assert Background(worker, max_jobs=max_jobs).join(60) == max_jobs
    assert (worker.loop.fetching, worker.loop.ride_held, len(worker.loop.claims)) == (0, None, 0)
    assert mq.counts("q")["completed"] == max_jobs
    assert Background(worker, burst=True).join(60) == 9 - max_jobs
    assert mq.counts("q")["completed"] == 9


@pytest.mark.parametrize(
    "pool,concurrency", [("thread", 1), ("thread", 3), ("process", 2), ("async", 3)]
)
@pytest.mark.parametrize("after", [0.0, 0.005, 0.02])
def test_a_stop_mid_drain_leaves_nothing_claimed_or_held(mq, pool, concurrency, after) -> None:
    for n in range(20):  # a parent and five children each, on the worker's queue
        kids = [Flow("q", "t.echo", i) for i in range(5)]
        mq.add_flow(Flow("q", "t.echo", n, job_id=f"p{n}", children=kids))
    worker = idle_worker(mq, concurrency=concurrency, pool=pool)
    bg = Background(worker)
    wait_for(lambda: worker.processed > 0, timeout=30, what="a job")
    time.sleep(after)
    worker.stop()
    bg.join(30)
    assert (worker.loop.fetching, worker.loop.ride_held, len(worker.loop.claims)) == (0, None, 0)
    assert mq.counts("q")["active"] == 0
    Background(worker, burst=True).join(60)  # the rest, in the next run
    assert mq.counts("q")["completed"] == 120


@pytest.mark.parametrize("max_jobs", [1, 3])
def test_a_ride_asked_for_while_the_loops_claim_is_out_counts_that_claim(mq, max_jobs) -> None:
    # the reporter's fetch for a riding claim may land while the loop's own
    # claim is on its way to Redis: the loop reserved that claim's count, so at
    # max_jobs the fetch is refused (it was granted: the run claimed one more)
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    worker = idle_worker(mq, concurrency=5)
    asked, claim = [], mq.claim

    def claim_with_a_fetch(queue, *args, **kw):  # the reporter's fetch, mid-claim
        room = worker.loop.fetch(queue)
        asked.append(room)
        if room is not None:  # the slot given back, as a claim that took nothing
            worker.loop._taken(queue, room[2], [])
        return claim(queue, *args, **kw)

    mq.claim = claim_with_a_fetch
    try:
        assert Background(worker, max_jobs=max_jobs).join(30) == max_jobs
    finally:
        del mq.claim
    assert asked[0] is None
    assert (worker.loop.fetching, worker.loop.claiming, worker.loop.claimed) == (0, 0, max_jobs)
    assert mq.counts("q")["completed"] == max_jobs
