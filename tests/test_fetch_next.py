"""A released parent starts at once
(docs/explanation/no-polling.md#a-released-parent-starts-at-once): the
completion of a child whose parent waits on the same queue carries a claim
of that queue in the same round trip, so the parent it releases comes back
with the reply; the worker holds a handler slot for it meanwhile. A child
whose parent is on another queue is delivered by its own worker, under its
queue's sweep lock taken in the completion's round trip."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from echomq_django import Flow, JobState, Worker
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners.pump import Pump
from echomq_django.runners.reporter import Finished, Reporter
from tests.support.jobkit import assert_state, claim_one, jref, leaf, node, record_calls
from tests.support.workerkit import Background, burst, fetching_reporter

# The flow outbox's own path, on the single server too (on one server a
# cross-queue completion skips it by default: tests/support/fixtures.py).
pytestmark = pytest.mark.via_flow_outbox


def two_children_running(mq):
    mq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    return claim_one(mq, "q", "c1"), claim_one(mq, "q", "c2")


def test_the_last_childs_completion_claims_its_parent(mq) -> None:
    c1, c2 = two_children_running(mq)
    done, claimed = mq.complete_then_claim([(c1, 1)], "q", 1, 5000, "t1")
    assert (done[0].released, list(claimed)) == ([], [])  # p still waits for c2
    done, claimed = mq.complete_then_claim([(c2, 2)], "q", 1, 5000, "t2")
    assert done[0].released == [("q", "p")]
    assert [(j.id, j.state) for j in claimed] == [("p", JobState.ACTIVE)]
    assert claimed[0].lease_deadline is not None
    assert_state(mq, "q", "p", JobState.ACTIVE)
    assert_state(mq, "q", "c2", JobState.COMPLETED)


def test_a_refused_completion_still_lets_the_claim_run(mq) -> None:
    c1, _ = two_children_running(mq)
    mq.enqueue("q", "other", job_id="o")
    c1.lease = "not-its-lease"
    done, claimed = mq.complete_then_claim([(c1, 1)], "q", 1, 5000, "t1")
    assert isinstance(done[0], Exception)
    assert [j.id for j in claimed] == ["o"]


def test_the_reporter_claims_with_a_same_queue_childs_completion(mq) -> None:
    c1, c2 = two_children_running(mq)
    reporter, asked, taken = fetching_reporter(mq)
    reporter.report([Finished(c1, 1), Finished(c2, 2)])
    assert asked == ["q"]
    [(queue, token, claimed)] = taken
    assert (queue, token, [j.id for j in claimed]) == ("q", "t1", ["p"])
    assert reporter.stats["completed"] == 2


def test_a_plain_jobs_completion_asks_no_room(mq) -> None:
    mq.enqueue("q", "plain", job_id="a")
    asked = []
    reporter = Reporter(mq, None, lambda *j: None, lambda q: None, lambda: None,
                        fetch=asked.append, taken=None)  # fmt: skip
    reporter.report([Finished(claim_one(mq, "q", "a"), 1)])
    assert asked == []
    assert_state(mq, "q", "a", JobState.COMPLETED)


def test_the_worker_holds_a_slot_for_the_reporters_claim(mq) -> None:
    worker = Worker(["q"], concurrency=1, mq=mq, register=False)
    loop = worker.loop
    loop.executing = 1
    assert loop.fetch("q") is None  # no free handler
    loop.executing = 0
    count, lease, token = loop.fetch("q")
    assert (count, lease, loop.fetching) == (1, 30_000, 1)
    assert loop.fetch("q") is None  # the one slot is held
    loop._taken("q", token, mq.claim("q", 1))  # nothing to claim: the slot is freed
    assert loop.fetching == 0
    loop._take("q", token, loop.done.get_nowait()[2])
    assert loop.executing == 0
    assert loop.fetch("elsewhere") is None  # not one of its queues
    _, _, token = loop.fetch("q")
    loop._taken("q", token, RedisUnavailable("gone"))  # its reply may be lost
    loop._take(*loop.done.get_nowait())
    assert (loop.fetching, loop.lost_claims) == (0, {"q": [(token, None)]})  # sent again next


def test_every_claim_lost_on_one_queue_is_sent_again(mq) -> None:
    """Two claims of one queue raise before the loop sends either again (a
    connection cut under the loop's claim and the reporter's): both go first,
    the resting queue too, and one whose job was leased gets it back, not
    left active until its lease ends. Meanwhile no completion carries a claim."""
    mq.enqueue("q", "t.echo", job_id="a")
    loop = Worker(["q"], concurrency=2, mq=mq, register=False).loop
    started: list[str] = []
    loop.pool = SimpleNamespace(start=lambda job, done: started.append(job.id), ahead=0)
    (_, _, t1), (_, _, t2) = loop.fetch("q"), loop.fetch("q")
    leased = mq.claim("q", 1, 30_000, token=t2)  # t2 ran, its reply lost; t1 was never sent
    for token in (t1, t2):
        loop._taken("q", token, RedisUnavailable("the reply was lost"))
        loop._take(*loop.done.get_nowait())
    assert loop.lost_claims == {"q": [(t1, None), (t2, None)]}
    assert loop.fetch("q") is None  # the loop's next claim goes first
    loop.rest["q"] = float("inf")  # drained, as far as the loop knew
    assert loop._claim(2, everywhere=False) == 1  # t1 finds nothing, then t2 replays "a"
    assert started == ["a"]
    assert started == [job.id for job in leased]
    assert (loop.lost_claims, loop.fetching, loop.executing) == ({}, 0, 1)
    assert loop.rest["q"] == float("inf")  # short, and nothing lost is left: it rests


def test_a_stop_sends_a_lost_claim_again_and_runs_its_jobs(mq) -> None:
    """A stop asked while a claim that ran is lost (its reply cut) sends that
    claim again before ``run()`` returns, and runs the jobs it leased, as the
    jobs it holds; it claims nothing new. Before, they stayed active, unseen,
    for their whole lease."""
    import threading

    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    worker = Worker(["q"], mq=mq, concurrency=2, register=False)
    real, lost = mq.claim, threading.Event()

    def claim(queue, count=1, lease_ms=None, token=None, yields_to=None):
        jobs = real(queue, count, lease_ms, token=token, yields_to=yields_to)
        if jobs and not lost.is_set():  # it ran; its reply is cut
            lost.set()
            raise RedisUnavailable("the reply was lost")
        return jobs

    mq.claim = claim
    bg = Background(worker)
    assert lost.wait(10)
    worker.stop()
    bg.join(30)
    assert worker.loop.lost_claims == {}
    counts = mq.counts("q")
    assert (counts["completed"], counts["active"], counts["pending"]) == (2, 0, 3)
    assert worker.loop.reporter.stats["completed"] == 2


# -- a parent on another queue: the worker delivers its child's completion ----


def reporter_of(mq, released: list) -> Reporter:
    return Reporter(mq, None, lambda *j: None, released.append, lambda: None)


def test_a_worker_alone_runs_a_cross_queue_parent_in_one_burst(mq) -> None:
    """No pump at all: the worker that completed the children delivers
    their outbox entries itself and runs the parent they released, whatever
    its concurrency (one report per child, or the children in one)."""
    for concurrency in (1, 4):
        pid = f"p{concurrency}"
        kids = [Flow("kids", "t.echo", i) for i in range(3)]
        mq.add_flow(Flow("q", "t.echo", "p", job_id=pid, children=kids))
        _, processed = burst(mq, ["q", "kids"], concurrency=concurrency, register=False)
        assert processed == 4
        assert_state(mq, "q", pid, JobState.COMPLETED)
        assert mq.client.llen(mq.keys.queue("kids").outbox) == 0  # delivered and taken out
        assert mq.client.exists(mq.keys.queue("kids").pump_lock) == 0  # dropped


def test_completions_reported_together_are_delivered_by_their_reporter(mq, monkeypatch) -> None:
    """One report of two cross-queue children: the sweep lock rides ahead of
    the completions, the delivery follows, then the forget and the drop, in
    three round trips; the parent is released and the loop told."""
    mq.add_flow(node("p", [leaf("c1", queue="kids"), leaf("c2", queue="kids")]))
    jobs = [claim_one(mq, "kids", "c1"), claim_one(mq, "kids", "c2")]
    released: list = []
    trips = record_calls(mq, monkeypatch)
    reporter_of(mq, released).report([Finished(j, 1) for j in jobs])
    assert trips == [
        ["lock_outbox", "complete"], ["deliver_to_parents"], ["forget_outbox", "lock_outbox"],
    ]  # fmt: skip
    assert mq.client.llen(mq.keys.queue("kids").outbox) == 0
    assert_state(mq, "q", "p", JobState.PENDING)
    assert released == ["q"]
    assert mq.children_values("q", "p") == {jref("c1", "kids"): 1, jref("c2", "kids"): 1}


def test_a_pump_holding_the_outbox_gets_the_entries(mq) -> None:
    """The take refused (a pump is sweeping): the reporter leaves the entry
    to the pump, which delivers it once it sweeps."""
    mq.add_flow(node("p", [leaf("c", queue="kids")]))
    job = claim_one(mq, "kids", "c")
    assert mq.outbox.lock("kids", "a-sweeping-pump", 60_000)
    released: list = []
    reporter_of(mq, released).report([Finished(job, 1)])
    assert (mq.client.llen(mq.keys.queue("kids").outbox), released) == (1, [])
    assert_state(mq, "q", "p", JobState.AWAITING_CHILDREN)
    assert mq.outbox.lock("kids", "a-sweeping-pump", 1, take=False)
    assert Pump(["kids"], mq=mq).sweep()["kids"]["delivered"] == 1
    assert_state(mq, "q", "p", JobState.PENDING)


def test_a_delivery_that_fails_leaves_the_entry_to_the_pump(mq, monkeypatch) -> None:
    """Redis refusing the delivery (a failover) after the completion: the job
    is completed all the same, the lock is dropped, and the entry waits in
    the outbox for a pump."""
    mq.add_flow(node("p", [leaf("c", queue="kids")]))
    job = claim_one(mq, "kids", "c")

    real = mq.scripts.run_many_confirmed

    def failing(calls, after=None):
        if calls[0][0] == "deliver_to_parents":
            raise RedisUnavailable("failing over")
        return real(calls, after)

    monkeypatch.setattr(mq.scripts, "run_many_confirmed", failing)
    reporter = reporter_of(mq, [])
    reporter.report([Finished(job, 1)])
    monkeypatch.undo()
    assert reporter.stats["completed"] == 1
    assert_state(mq, "kids", "c", JobState.COMPLETED)
    assert mq.client.exists(mq.keys.queue("kids").pump_lock) == 0
    assert mq.client.llen(mq.keys.queue("kids").outbox) == 1
    assert Pump(["kids"], mq=mq).sweep()["kids"]["delivered"] == 1
    assert_state(mq, "q", "p", JobState.PENDING)


def test_the_delivery_claims_the_released_parent_in_its_round_trip(mq, monkeypatch) -> None:
    """The loop has room on the parent's queue: the claim rides behind the
    delivery, and the parent comes back with its reply (no claim of its own)."""
    mq.add_flow(node("p", [leaf("c", queue="kids")]))
    job = claim_one(mq, "kids", "c")
    got: list = []
    reporter = Reporter(
        mq, None, lambda *j: None, lambda q: None, lambda: None,
        fetch=lambda q, last=False: (1, 5000, "t-fetch") if q == "q" else None,
        taken=lambda q, token, claimed: got.append((q, token, claimed)),
    )  # fmt: skip
    trips = record_calls(mq, monkeypatch)
    reporter.report([Finished(job, 1)])
    assert trips == [
        ["lock_outbox", "complete"],
        ["deliver_to_parents", "claim"],
        ["forget_outbox", "lock_outbox"],
    ]
    [(queue, token, claimed)] = got
    assert (queue, token, [j.id for j in claimed]) == ("q", "t-fetch", ["p"])
    assert_state(mq, "q", "p", JobState.ACTIVE)


@pytest.mark.parametrize(
    "policy, parent_state",
    [
        ({"ignore_dependency_on_failure": True}, JobState.COMPLETED),
        ({"remove_dependency_on_failure": True}, JobState.COMPLETED),
        ({"continue_parent_on_failure": True}, JobState.COMPLETED),
        ({}, JobState.DEAD),
    ],
)
def test_a_child_dying_in_its_own_report_leaves_the_outbox_clean(mq, policy, parent_state) -> None:
    """A child whose result cannot be encoded dies in the report that tried to
    complete it (``PayloadError``), on its handler thread: the completion's
    take of the sweep lock and the death's take again, in one report, end
    with the death's entry delivered, taken out, and the lock dropped, under
    every policy (a second drop ahead of the take out left it for a pump)."""
    kids = [
        Flow("kids", "t.echo", 1, job_id="c0"),
        Flow("kids", "t.bad_result", None, job_id="c1", max_attempts=1, **policy),
    ]
    mq.add_flow(Flow("q", "t.echo", "P", job_id="p", children=kids))
    _, processed = burst(mq, ["q", "kids"], concurrency=1, register=False)
    assert mq.get_job("kids", "c1").state is JobState.DEAD
    assert mq.get_job("q", "p").state is parent_state
    assert processed == (3 if parent_state is JobState.COMPLETED else 2)
    keys = mq.keys.queue("kids")
    assert mq.client.lrange(keys.outbox, 0, -1) == []
    assert mq.client.exists(keys.pump_lock) == 0
