"""A sibling rides in the parent's slot
(docs/explanation/no-polling.md#a-released-parent-starts-at-once): on one
server, the completion of a child whose parent waits on another queue
carries a claim of the parent's queue and, after it, a claim of the child's
own queue that yields to it (``complete_then_claim``'s ``or_else``): the
second takes a job only when the first took none, so the slot held for the
parent starts the next sibling instead of staying empty until the reply.
On a Redis Cluster the two queues' slots are apart: no claim yields to
another queue's; the claim of the child's own queue rides its completion
alone (into the worker's last free slot), and the parent's claim rides the
delivery."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from echomq_django import Flow, JobState, Worker
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners import delivery
from echomq_django.runners.reporter import Finished
from tests.support.jobkit import assert_state, claim_one, leaf, node
from tests.support.workerapp.jobs import GATES
from tests.support.workerkit import Background, burst, fetching_reporter, wait_for


def three_kids_one_running(mq):
    mq.add_flow(node("p", [leaf(c, queue="kids") for c in ("c1", "c2", "c3")]))
    return claim_one(mq, "kids", "c1")


def ids(claimed) -> list[str]:
    return [job.id for job in claimed]


def assert_refused_on_a_cluster(mq) -> None:
    """On a Cluster the two queues' slots are apart: a claim that would
    yield to another queue's is refused before anything is sent."""
    mq.enqueue("kids", "t.echo", job_id="waiting")
    with pytest.raises(ValueError, match="a claim yielding to another queue's needs one server"):
        mq.claim("kids", 1, 5000, token="t2", yields_to=("q", "t1"))
    assert_state(mq, "kids", "waiting", JobState.PENDING)
    assert mq.client.exists(mq.keys.queue("kids").claim("t2")) == 0


def test_the_claim_after_the_parents_takes_a_sibling_while_the_parent_waits(mq) -> None:
    if not mq.cross_queue_scripts:
        c1 = three_kids_one_running(mq)
        with pytest.raises(
            ValueError, match="a claim yielding to another queue's needs one server"
        ):
            mq.complete_then_claim([(c1, 1)], "q", 1, 5000, "t1", or_else=("kids", 5000, "t2"))
        assert_state(mq, "kids", "c1", JobState.ACTIVE)  # nothing was sent
        return
    c1 = three_kids_one_running(mq)
    done, (parent_claim, sibling) = mq.complete_then_claim(
        [(c1, 1)], "q", 1, 5000, "t1", or_else=("kids", 5000, "t2")
    )
    assert (done[0].released, ids(parent_claim), ids(sibling)) == ([], [], ["c2"])
    assert sibling[0].lease_deadline is not None
    assert_state(mq, "kids", "c2", JobState.ACTIVE)
    assert_state(mq, "kids", "c3", JobState.PENDING)


def test_the_claim_after_the_parents_takes_nothing_once_the_parent_is_taken(mq) -> None:
    if not mq.cross_queue_scripts:
        assert_refused_on_a_cluster(mq)
        return
    mq.add_flow(node("p", [leaf("c1", queue="kids")]))
    mq.enqueue("kids", "t.echo", job_id="other")
    c1 = claim_one(mq, "kids", "c1")
    call = ([(c1, 1)], "q", 1, 5000, "t1")
    done, (parent_claim, sibling) = mq.complete_then_claim(*call, or_else=("kids", 5000, "t2"))
    assert (done[0].released, ids(parent_claim), ids(sibling)) == ([("q", "p")], ["p"], [])
    assert_state(mq, "kids", "other", JobState.PENDING)  # left for the next free slot
    assert mq.client.exists(mq.keys.queue("kids").claim("t2")) == 0  # it wrote nothing
    # the round trip sent again (a lost reply): the same parent, and still nothing
    assert ids(mq.claim("q", 1, 5000, token="t1")) == ["p"]
    assert ids(mq.claim("kids", 1, 5000, token="t2")) == ["other"]  # a fresh claim of its own


def test_a_reporter_rides_a_siblings_claim_in_the_parents_slot(mq) -> None:
    c1 = three_kids_one_running(mq)
    reporter, asked, taken = fetching_reporter(mq)
    reporter.report([Finished(c1, 1)])
    if (
        not mq.cross_queue_scripts
    ):  # the sibling's claim rides the completion, the parent's the delivery
        assert asked == ["kids", "q"]
        assert [(q, t, ids(got)) for q, t, got in taken] == [
            ("kids", "t1", ["c2"]),
            ("q", "t2", []),
        ]
        assert_state(mq, "kids", "c2", JobState.ACTIVE)
        assert_state(mq, "kids", "c3", JobState.PENDING)
        return
    assert asked == ["q", "kids"]
    # the sibling's first: its slot is the parent's, given back after it
    assert [(q, t, ids(got)) for q, t, got in taken] == [("kids", "t2", ["c2"]), ("q", "t1", [])]


def test_a_siblings_claim_alone_takes_only_the_last_free_slot(mq) -> None:
    """``last``: with other slots free the loop claims for them itself, in
    batches; a claim riding each report would only add scripts to a drain."""
    loop = Worker(["q", "kids"], concurrency=2, mq=mq, register=False).loop
    assert loop.fetch("kids", last=True) is None
    loop.executing = 1  # one handler busy: the free slot is the last
    _, _, token = loop.fetch("kids", last=True)
    assert (loop.fetching, loop._tokens) == (1, {token: 1})
    assert loop.fetch("kids", last=True) is None  # none free now


def test_a_shared_slot_is_held_once(mq) -> None:
    worker = Worker(["q", "kids"], concurrency=1, mq=mq, register=False)
    loop = worker.loop
    _, _, first = loop.fetch("q")
    _, _, second = loop.fetch("kids", yields_to=("q", first))  # the one slot, held already
    assert (loop.fetching, loop.fetch("kids")) == (1, None)
    loop.concurrency = 2  # another slot free: the loop claims for it, no claim yields
    assert loop.fetch("kids", yields_to=("q", first)) is None
    loop.concurrency = 1
    loop._taken("kids", second, ["a job"])  # the sibling took the slot...
    loop._taken("q", first, [])  # ...and the parent's claim gave it back
    assert loop.fetching == 1
    posted = [loop.done.get_nowait(), loop.done.get_nowait()]
    assert [q for q, _, _ in posted] == ["kids", "q"]
    loop._take(*posted[1])  # the parent's, empty
    assert (loop.fetching, list(loop._tokens)) == (1, [second])  # until the loop starts it
    loop._tokens.clear()
    loop._pairs.clear()
    loop.fetching = 0
    # a lost reply: both tokens are sent again by the loop's next claims, as a pair
    _, _, first = loop.fetch("q")
    _, _, second = loop.fetch("kids", yields_to=("q", first))
    for queue, token in (("kids", second), ("q", first)):
        loop._taken(queue, token, RedisUnavailable("gone"))
        loop._take(*loop.done.get_nowait())
    assert (loop.fetching, loop._pairs) == (0, {})
    assert loop.lost_claims == {"kids": [(second, ("q", first))], "q": [(first, ("kids", second))]}


def lost_pair(mq, loop, child):
    """Hold the slot as the reporter does, send the pair with ``child``'s
    completion, and lose its reply: Redis ran it, the worker heard nothing."""
    _, _, t1 = loop.fetch("q")
    _, _, t2 = loop.fetch("kids", yields_to=("q", t1))
    mq.complete_then_claim([(child, 1)], "q", 1, 5000, t1, or_else=("kids", 5000, t2))
    for queue, token in (("kids", t2), ("q", t1)):
        loop._taken(queue, token, RedisUnavailable("the reply was lost"))
        loop._take(*loop.done.get_nowait())


def test_a_pair_whose_reply_was_lost_is_sent_again_as_a_pair(mq) -> None:
    """The parent the lost round trip leased gets the one slot: the
    sibling's token, sent again first, yields to the parent's as it did."""
    if not mq.cross_queue_scripts:
        assert_refused_on_a_cluster(mq)
        return
    mq.add_flow(node("p", [leaf("c1", queue="kids")]))
    mq.enqueue("kids", "t.echo", job_id="s0")
    loop = Worker(["q", "kids"], concurrency=1, mq=mq, register=False).loop
    started: list[str] = []
    loop.pool = SimpleNamespace(start=lambda job, done: started.append(job.id), ahead=0)
    lost_pair(mq, loop, claim_one(mq, "kids", "c1"))
    assert list(loop.lost_claims) == ["kids", "q"]  # the sibling's first
    assert loop._claim(1, everywhere=True) == 1
    assert started == ["p"]
    assert_state(mq, "kids", "s0", JobState.PENDING)
    assert (loop.lost_claims, loop.fetching, loop.executing) == ({}, 0, 1)


def test_a_pair_sent_twice_takes_one_slot_s_jobs(mq) -> None:
    """redis-py sends a pipeline again after a dropped connection: the
    parent's claim, empty the first time, yields to the sibling's the
    second, though a job came to its queue in between."""
    if not mq.cross_queue_scripts:
        assert_refused_on_a_cluster(mq)
        return
    mq.add_flow(node("p", [leaf("c1", queue="kids"), leaf("c2", queue="kids")]))
    c1 = claim_one(mq, "kids", "c1")
    call = ([(c1, 1)], "q", 1, 5000, "t1")
    _, first = mq.complete_then_claim(*call, or_else=("kids", 5000, "t2"))
    mq.enqueue("q", "t.echo", job_id="x")
    _, again = mq.complete_then_claim(*call, or_else=("kids", 5000, "t2"))
    assert [ids(c) for c in first] == [ids(c) for c in again] == [[], ["c2"]]
    assert_state(mq, "q", "x", JobState.PENDING)


def test_a_worker_of_one_handler_claims_the_first_child_alone(mq, monkeypatch) -> None:
    """Parent on q, three children on kids, one handler: the loop's own
    claims take only the first child; the others ride their siblings'
    completions, and the parent the last one's (one server) or its delivery
    (a Cluster)."""
    kids = [Flow("kids", "t.echo", i, job_id=f"c{i}") for i in range(3)]
    mq.add_flow(Flow("q", "t.echo", "p", job_id="p", children=kids))
    own: list[str] = []
    claim = mq.claim

    def recorded(queue, *args, **kw):
        got = claim(queue, *args, **kw)
        own.extend(job.id for job in got)
        return got

    monkeypatch.setattr(mq, "claim", recorded)
    _, processed = burst(mq, ["q", "kids"], concurrency=1, register=False)
    assert processed == 4
    assert_state(mq, "q", "p", JobState.COMPLETED)
    assert own == ["c0"]


def recorded_deliveries(mq, monkeypatch) -> list[list[str]]:
    """The children each of the worker's own deliveries carried (``deliver_own``)."""
    carried: list[list[str]] = []
    deliver_own = mq.outbox.deliver_own

    def recorded(queue, token, texts, *args, **kw):
        carried.append([json.loads(t)["c"].rsplit(":", 1)[-1] for t in texts])
        return deliver_own(queue, token, texts, *args, **kw)

    monkeypatch.setattr(mq.outbox, "deliver_own", recorded)
    return carried


def test_a_worker_of_one_handler_delivers_its_children_together(mq, monkeypatch) -> None:
    """On a Cluster each child's completion claims the next sibling into its
    thread, and its delivery waits for that sibling's (delivery.HOLD_S at
    most): the three reach the parent in one delivery, a round trip to each
    slot fewer per child. On one server the completions resolve the parent."""
    monkeypatch.setattr(delivery, "HOLD_S", 30.0)  # the bound out of the way: a slow machine
    kids = [Flow("kids", "t.echo", i, job_id=f"c{i}") for i in range(3)]
    mq.add_flow(Flow("q", "t.echo", "p", job_id="p", children=kids))
    carried = recorded_deliveries(mq, monkeypatch)
    _, processed = burst(mq, ["q", "kids"], concurrency=1, register=False)
    assert processed == 4
    assert_state(mq, "q", "p", JobState.COMPLETED)
    assert mq.children_values("q", "p") == {("kids", f"c{i}"): i for i in range(3)}
    assert carried == ([] if mq.cross_queue_scripts else [["c0", "c1", "c2"]])
    assert mq.client.llen(mq.keys.queue("kids").outbox) == 0  # delivered and taken out


def test_a_delivery_held_for_a_sibling_goes_while_the_sibling_runs(mq, monkeypatch) -> None:
    """The hold's bound: a sibling that runs past delivery.HOLD_S does not keep
    its sibling's value from the parent (the reporter's thread delivers it)."""
    GATES.pop("slow", None)
    kids = [Flow("kids", "t.echo", 0, job_id="c0"), Flow("kids", "t.gate", "slow", job_id="c1")]
    mq.add_flow(Flow("q", "t.echo", "p", job_id="p", children=kids))
    carried = recorded_deliveries(mq, monkeypatch)
    worker = Worker(["q", "kids"], concurrency=1, mq=mq, register=False, block_timeout=0.5)
    bg = Background(worker)
    try:
        wait_for(lambda: mq.children_values("q", "p"), timeout=5, what="c0's value at p")
        assert mq.children_values("q", "p") == {("kids", "c0"): 0}
        assert_state(mq, "kids", "c1", JobState.ACTIVE)  # still running: the gate is shut
        assert carried == ([] if mq.cross_queue_scripts else [["c0"]])
        GATES.setdefault("slow", threading.Event()).set()
        wait_for(lambda: mq.get_job("q", "p").state is JobState.COMPLETED, what="p completed")
        assert carried == ([] if mq.cross_queue_scripts else [["c0"], ["c1"]])
    finally:
        GATES.setdefault("slow", threading.Event()).set()
        worker.stop()
        bg.join(30)


def test_only_a_completions_done_entries_wait_for_a_sibling() -> None:
    """A death's entries (a refusal with ``sent``) and a callback's job act at
    once on another slot, and are delivered at once; a ``done`` is the same
    delivered twice (a lock lost while it waited: the pump's too)."""
    done = json.dumps({"k": "done", "c": "emq:{kids}:job:c0", "p": "p", "q": "q", "v": 1})
    callback = json.dumps({"k": "cb", "c": "emq:{kids}:job:c0", "p": "cb1", "q": "q"})
    ok = (object(), 0)
    assert delivery._held([done], [ok])
    assert not delivery._held([done, callback], [ok])
    assert not delivery._held([done], [(object(), RuntimeError("EMQCANCELLED kids c0"))])
    assert not delivery._held([done, done], [ok, ok])  # a batch of two: at once
    assert not delivery._held([], [ok])
