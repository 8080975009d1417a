"""Blocking claims and the worker's timers: a worker or pump acts on a
wake-up, never by polling, on both rigs. Every test makes the poll-era paths impossible (a
blocking timeout and a sweep interval far longer than the test may wait)
and asserts on the path taken: the claim came from a wake-up, the timers
promoted or recovered the job, the pump delivered on its wake-up."""

from __future__ import annotations

import threading

import pytest

from echomq_django import Flow, JobState, Worker, handler
from echomq_django.runners.pump import Pump
from tests.support.workerkit import Background, wait_for

NEVER = 3600.0  # s: a timeout or interval no test waits for
gates: dict[str, threading.Event] = {}
barrier = threading.Barrier(2, timeout=10)


@handler("blk.gate")
def gate(job):
    """Waits until the test opens ``gates[payload]``, then returns it."""
    assert gates[job.payload].wait(10), "the test never opened the gate"
    return job.payload


@handler("blk.pair")
def pair(job):
    """Returns only once a second job is running at the same time."""
    barrier.wait()
    return job.payload


def idle_worker(mq, queues=("q",), **kw) -> Worker:
    options = {"block_timeout": NEVER, "sweep_interval": NEVER, **kw}
    return Worker(list(queues), mq=mq, **options)


def done(mq, queue, job_id) -> bool:
    return mq.get_job(queue, job_id).state is JobState.COMPLETED


@pytest.fixture
def running():
    """Start workers on threads; every one is stopped and joined after the test."""
    started: list[Background] = []

    def start(worker: Worker) -> Worker:
        started.append(Background(worker))
        wait_for(lambda: worker.waiting, what="the worker blocking on its queues")
        return worker

    yield start
    for bg in started:
        bg.worker.stop()
    for bg in started:
        bg.join()


def test_an_idle_worker_claims_on_the_wake_up(mq, running) -> None:
    worker = running(idle_worker(mq, ("q", "r"), concurrency=2))
    mq.enqueue("r", "t.echo", 7, job_id="a")
    wait_for(lambda: done(mq, "r", "a"), what="the job to run")
    assert worker.wakeups["claimable"] >= 1
    assert mq.get_job("r", "a").result == 7


def test_a_job_that_came_while_every_thread_was_busy_runs_when_one_frees(mq, running) -> None:
    gates["one"] = threading.Event()
    worker = running(idle_worker(mq, concurrency=1))
    mq.enqueue("q", "blk.gate", "one", job_id="busy")
    wait_for(lambda: mq.get_job("q", "busy").state is JobState.ACTIVE, what="the first job")
    mq.enqueue("q", "t.echo", 2, job_id="next")  # no free thread: nobody may take the marker
    assert mq.get_job("q", "next").state is JobState.PENDING
    gates["one"].set()
    wait_for(lambda: done(mq, "q", "next"), what="the second job")
    # the worker counts a completion once Redis answered its report: a moment
    # after the row says completed
    wait_for(lambda: worker.stats["completed"] == 2, what="the worker's count")


def test_a_worker_whose_free_slots_wait_on_its_own_claims_takes_no_wake_up(mq) -> None:
    """A slot the reporter holds for a claim riding a completion is not free:
    the worker's waker stays disarmed meanwhile, so a worker draining a flow
    alone pops almost none of the wake markers its claims leave for other
    workers: 28 to 48 in a 1+300 flow before (thirty runs), 0 or 1 after. The
    one is a slot truly free for a moment (a handler finished and the loop
    has not claimed for it yet) while the marker says jobs are left; under
    load that moment comes more often, hence the margin."""
    kids = [Flow("q", "t.echo", i) for i in range(300)]
    mq.add_flow(Flow("q", "t.echo", "p", job_id="p", children=kids))
    worker = Worker(["q"], concurrency=8, mq=mq, register=False)
    assert worker.run(burst=True) == 301
    assert worker.wakeups["claimable"] <= 3
    assert worker.wakeups["returned"] <= 1
    assert (worker.wakeups["due"], worker.wakeups["reconnect"]) == (0, 0)
    assert (mq.get_job("q", "p").state, mq.get_job("q", "p").result) == (JobState.COMPLETED, "p")


def test_several_idle_workers_on_one_queue_all_take_jobs(mq, running) -> None:
    barrier.reset()
    first = running(idle_worker(mq, concurrency=1))
    second = running(idle_worker(mq, concurrency=1))
    mq.enqueue("q", "blk.pair", 1, job_id="a")
    mq.enqueue("q", "blk.pair", 2, job_id="b")  # each handler waits for the other
    wait_for(lambda: done(mq, "q", "a") and done(mq, "q", "b"), what="both jobs")
    assert (first.stats["completed"], second.stats["completed"]) == (1, 1)


def test_a_retry_runs_with_only_the_worker(mq, running) -> None:
    worker = running(idle_worker(mq, concurrency=1))
    mq.enqueue("q", "t.flaky", {"fail_times": 1}, job_id="f", backoff_ms=100)
    wait_for(lambda: done(mq, "q", "f"), what="the retry")
    assert mq.get_job("q", "f").result == {"attempt": 2}
    assert worker.timers.promoted == 1, "the worker's timer promoted the retry"
    assert worker.wakeups["due"] >= 1, "it learnt the run-at from the wake key"


def test_a_delayed_job_runs_with_only_the_worker(mq, running) -> None:
    worker = running(idle_worker(mq, concurrency=1))
    mq.enqueue("q", "t.echo", "later", job_id="d", delay_ms=200)
    wait_for(lambda: done(mq, "q", "d"), what="the delayed job")
    assert worker.timers.promoted == 1


def test_a_dead_workers_job_is_recovered_by_a_worker(mq, running) -> None:
    mq.enqueue("q", "t.echo", "again", job_id="s")
    mq.claim("q", 1, lease_ms=100)  # a worker that died holding it
    worker = running(idle_worker(mq, concurrency=1, sweep_interval=0.1))
    wait_for(lambda: done(mq, "q", "s"), what="the recovered job")
    assert worker.timers.recovered == 1
    assert mq.get_job("q", "s").attempts == 2


def test_a_restarted_worker_recovers_a_dead_workers_job_within_its_lease(redis_client) -> None:
    """The worker that died holding the job also took the queue's timers
    lock at its last sweep (it holds sweeps off for 10 s); its successor
    recovers the job by its lease deadline (+1 s), read from Redis: the
    active set's score and the 'stalled' event's stream id (ms).
    docs/explanation/reliability.md#leases-and-recovery"""
    from echomq_django import EchoMQ

    mq = EchoMQ(redis_client, queues={"q": {"LEASE_MS": 1000}})
    mq.enqueue("q", "t.echo", "again", job_id="s")
    mq.claim("q", 1)  # the dead worker's claim
    k = mq.keys.queue("q")
    deadline = int(mq.client.zscore(k.active, "s"))
    mq.client.set(k.timers_lock, "the-dead-worker", px=60_000)  # its last sweep
    worker = Background(idle_worker(mq, concurrency=1))
    try:
        wait_for(lambda: done(mq, "q", "s"), what="the recovered job")
    finally:
        worker.worker.stop()
        worker.join()
    events = mq.probes.events_after("q", "0", 100)
    stalled = [(xid, jid) for xid, jid, e in events if e == "stalled"]
    assert [jid for _, jid in stalled] == ["s"]
    recovered_at = int(stalled[0][0].split("-")[0])
    assert deadline < recovered_at <= deadline + 1000
    assert (worker.worker.timers.recovered, worker.worker.timers.sweeps) == (1, 0)
    assert mq.get_job("q", "s").attempts == 2


def test_a_worker_alone_fires_a_parents_children_timeout(mq, running) -> None:
    """No pump: the worker's sweep learns the deadline, its timer fires it
    (docs/explanation/reliability.md#leases-and-recovery); the child's queue
    has no worker at all."""
    kids = [Flow("kids", "t.echo", 1, job_id="c")]
    mq.add_flow(Flow("q", "t.sum_children", job_id="p", children=kids, children_timeout_ms=300))
    worker = running(idle_worker(mq, concurrency=1))
    wait_for(lambda: mq.get_job("q", "p").state is JobState.DEAD, what="the children timeout")
    assert (mq.get_job("q", "p").error, worker.timers.expired) == ("children timed out", 1)
    assert worker.timers.sweeps == 1  # at start: the timer fired it, not a later sweep


def test_ten_workers_sweep_a_queue_once_per_interval(mq) -> None:
    mq.enqueue("q", "t.echo", 1, delay_ms=60_000)  # something to watch: an idle queue is not swept
    workers = [idle_worker(mq, sweep_interval=60) for _ in range(10)]
    for w in workers:
        w.timers.run()
    assert sorted(w.timers.sweeps for w in workers) == [0] * 9 + [1]


@pytest.mark.via_flow_outbox
def test_the_pump_delivers_on_its_wake_up(mq) -> None:
    mq.add_flow(Flow("p", "t.sum_children", job_id="p", children=[Flow("kids", "t.echo", 3)]))
    pump = Pump(["p", "kids"], mq=mq)
    stop = threading.Event()
    thread = threading.Thread(
        target=pump.run, kwargs={"interval": NEVER, "should_stop": stop.is_set}
    )
    thread.start()
    try:
        wait_for(lambda: pump.waiting, what="the pump blocking on its outboxes")
        mq.complete(mq.claim("kids", 1)[0], 3)
        # (the parent is released before the pump's counters move: wait for both)
        wait_for(lambda: pump.totals.delivered == 1, what="the delivery")
        assert mq.get_job("p", "p").state is JobState.PENDING
        assert pump.wakeups == 1
    finally:
        stop.set()
        pump.stop()
        thread.join(10)


@pytest.mark.parametrize(
    "policy,state,result",
    [
        ("ignore_dependency_on_failure", JobState.COMPLETED, "P"),
        ("fail_parent_on_failure", JobState.DEAD, None),
        ("continue_parent_on_failure", JobState.COMPLETED, "P"),
    ],
)
def test_a_dead_childs_parent_on_another_queue_settles_with_no_pump(
    mq, running, policy, state, result
) -> None:
    # the death pushes its entry onto the child's queue's outbox; the worker
    # that failed it takes that outbox's sweep lock ahead of the fail and
    # delivers the entry itself, as it does a completion's: the parent does not
    # wait for a pump or a sweep (neither runs here; it waited for the sweep)
    worker = running(idle_worker(mq, ("p", "c"), concurrency=2, register=False))
    wait_for(lambda: worker.waiting, what="the worker blocking")
    kid = Flow("c", "t.fail", None, job_id="k", max_attempts=1, **{policy: True})
    mq.add_flow(Flow("p", "t.echo", "P", job_id="p", children=[kid]))
    wait_for(lambda: mq.get_job("p", "p").state is state, what=f"the parent {state.value}")
    assert mq.get_job("c", "k").state is JobState.DEAD
    assert mq.get_job("p", "p").result == result
    assert mq.client.llen(mq.keys.queue("c").outbox) == 0


def test_a_chain_of_deaths_across_three_queues_settles_with_no_pump(mq, running) -> None:
    # the child's death kills its parent (fp) as the worker delivers it; that
    # parent's own death goes onto its queue's outbox for the top on a third
    # queue: the worker delivers it too (it waited for a pump or a sweep)
    running(idle_worker(mq, ("g", "p", "c"), concurrency=2, register=False))
    kid = Flow("c", "t.fail", None, job_id="k", max_attempts=1)
    mid = Flow("p", "t.echo", "P", job_id="m", children=[kid])
    mq.add_flow(Flow("g", "t.echo", "G", job_id="g", children=[mid]))
    wait_for(lambda: mq.get_job("g", "g").state is JobState.DEAD, what="the top dead")
    assert mq.get_job("p", "m").state is JobState.DEAD
    assert mq.get_job("g", "g").error.startswith("failed by child")
    assert [mq.client.llen(mq.keys.queue(q).outbox) for q in ("c", "p")] == [0, 0]


@pytest.mark.parametrize(
    "policy,state",
    [
        ("ignore_dependency_on_failure", JobState.COMPLETED),
        ("fail_parent_on_failure", JobState.DEAD),
    ],
)
def test_a_child_cancelled_while_it_ran_settles_its_parent_with_no_pump(
    mq, running, policy, state
) -> None:
    # its handler returns: the completion is refused and the child dies
    # 'cancelled' in it; that death's entry came back with the refusal and the
    # worker delivers it (it waited for a pump or a sweep)
    gates["cancelled"] = threading.Event()
    running(idle_worker(mq, ("p", "c"), concurrency=2, register=False))
    kid = Flow("c", "blk.gate", "cancelled", job_id="k", **{policy: True})
    mq.add_flow(Flow("p", "t.echo", "P", job_id="p", children=[kid]))
    wait_for(lambda: mq.get_job("c", "k").state is JobState.ACTIVE, what="the child running")
    mq.cancel("c", "k")
    gates["cancelled"].set()
    wait_for(lambda: mq.get_job("p", "p").state is state, what=f"the parent {state.value}")
    assert mq.get_job("c", "k").error == "cancelled"
    assert mq.client.llen(mq.keys.queue("c").outbox) == 0


def test_a_parent_claimed_by_a_delivery_runs_before_its_entries_leave_the_outbox(
    mq, running, monkeypatch
) -> None:
    # the worker delivers a dead child's entry with a claim of the parent's
    # queue riding it; the parent goes to a handler as soon as that round trip
    # answers: it completes while the next one (the entries out of the outbox,
    # the lock dropped) is held back
    real_run_many, held = mq.scripts.run_many, []
    real_claimed, riding = mq.wire.claimed, []
    parent_done = threading.Event()

    def claimed(queue, *args, **kw):  # the parent's queue: only the claim riding the delivery
        got = real_claimed(queue, *args, **kw)
        riding.extend(job.id for job in got if queue == "p")
        return got

    def run_many(calls, *args, **kw):
        if any(call[0] == "forget_outbox" for call in calls):
            held.append((list(riding), parent_done.wait(10)))
        return real_run_many(calls, *args, **kw)

    @handler("blk.parent_done")
    def parent(job):
        parent_done.set()
        return "P"

    monkeypatch.setattr(mq.wire, "claimed", claimed)
    monkeypatch.setattr(mq.scripts, "run_many", run_many)
    running(idle_worker(mq, ("p", "c"), concurrency=2, register=False))
    kid = Flow("c", "t.fail", None, job_id="k", max_attempts=1, ignore_dependency_on_failure=True)
    mq.add_flow(Flow("p", "blk.parent_done", None, job_id="p", children=[kid]))
    wait_for(lambda: done(mq, "p", "p"), timeout=5, what="the parent completed")
    wait_for(lambda: held, timeout=5, what="the entries taken out of the outbox")
    # the claim riding the delivery took the parent, and it had run before the
    # entries left the outbox
    assert held == [(["p"], True)]
    assert mq.get_job("p", "p").result == "P"
    wait_for(lambda: mq.client.llen(mq.keys.queue("c").outbox) == 0, what="the outbox empty")


def test_a_parent_claimed_by_a_delivery_runs_once_when_its_entries_cannot_be_taken_out(
    mq, running, monkeypatch
) -> None:
    # the round trip that takes the delivered entries out of the outbox fails:
    # the parent the delivery's claim took runs once, the loop's count of
    # claims on their way comes back to 0, and the entries stay for a pump
    # once the worker's lock has run out its lease; the pump's delivery of
    # them again changes nothing
    from echomq_django.core.exceptions import RedisUnavailable

    real_run_many, failed = mq.scripts.run_many, []

    def run_many(calls, *args, **kw):
        if any(call[0] == "forget_outbox" for call in calls):
            failed.append(len(calls))
            raise RedisUnavailable("the connection dropped")
        return real_run_many(calls, *args, **kw)

    monkeypatch.setattr(mq.scripts, "run_many", run_many)
    worker = running(idle_worker(mq, ("p", "c"), concurrency=2, register=False))
    kid = Flow("c", "t.fail", None, job_id="k", max_attempts=1, ignore_dependency_on_failure=True)
    mq.add_flow(Flow("p", "t.echo", "P", job_id="p", children=[kid]))
    wait_for(lambda: done(mq, "p", "p"), timeout=5, what="the parent completed")
    wait_for(lambda: worker.loop.fetching == 0, timeout=5, what="no claim on its way")
    parent = mq.get_job("p", "p")
    assert (parent.result, parent.attempts) == ("P", 1)
    assert failed == [2]  # the forget and the lock's drop, in one round trip
    outbox, lock = mq.keys.queue("c").outbox, mq.keys.queue("c").pump_lock
    assert mq.client.llen(outbox) == 1  # left to a pump
    assert 0 < mq.client.pttl(lock) <= 2000  # the worker's lock, left to its lease
    wait_for(lambda: mq.client.get(lock) is None, timeout=5, what="the lock's lease ended")
    monkeypatch.setattr(mq.scripts, "run_many", real_run_many)
    Pump(["c"], mq=mq).sweep()
    assert mq.client.llen(outbox) == 0
    parent = mq.get_job("p", "p")
    assert (parent.state, parent.result, parent.attempts) == (JobState.COMPLETED, "P", 1)


def test_a_claim_riding_a_deaths_delivery_whose_reply_was_lost_runs_at_once(
    mq, running, monkeypatch
) -> None:
    # the worker delivers a dead child's entry with a claim of the parent's
    # queue riding it; the reply is lost (a connection killed) after Redis ran
    # both: the claim is replayed with its token at once, though the worker's
    # parent queue rests drained, and the parent runs (it stayed active,
    # unseen, until its lease ended)
    from echomq_django.core.exceptions import RedisUnavailable

    real, lost = mq.outbox.deliver_own, []

    def deliver_own(queue, token, texts, then=None, more=None, delivered=None):
        def reply_lost(outcome, got):  # Redis ran the delivery and the claim
            if lost:
                return delivered(outcome, got)
            lost.append(queue)
            raise RedisUnavailable("the reply was lost")

        return real(queue, token, texts, then, more, reply_lost)

    monkeypatch.setattr(mq.outbox, "deliver_own", deliver_own)
    running(idle_worker(mq, ("p", "c"), concurrency=2, register=False))
    kid = Flow("c", "t.fail", None, job_id="k", max_attempts=1, ignore_dependency_on_failure=True)
    mq.add_flow(Flow("p", "t.echo", "P", job_id="p", children=[kid]))
    wait_for(lambda: done(mq, "p", "p"), timeout=5, what="the parent completed")
    assert lost == ["c"]
