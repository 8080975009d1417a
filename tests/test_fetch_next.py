"""A released parent starts at once
(docs/explanation/no-polling.md#a-released-parent-starts-at-once): the
completion of a child whose parent waits on the same queue carries a claim
of that queue in the same round trip, so the parent it releases comes back
with the reply; the worker holds a handler slot for it meanwhile."""

from __future__ import annotations

from echomq_django import JobState, Worker
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners.reporter import Finished, Reporter
from tests.support.jobkit import assert_state, claim_one, leaf, node


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
    asked, taken = [], []

    def fetch(queue):
        asked.append(queue)
        return 1, 5000, f"t{len(asked)}"

    reporter = Reporter(mq, None, lambda *j: None, lambda q: None, lambda: None,
                        fetch=fetch, taken=lambda *got: taken.append(got))  # fmt: skip
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
    assert (loop.fetching, loop.lost_claims) == (0, {"q": token})  # replayed by the next claim
