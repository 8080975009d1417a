"""Cancel, on both rigs: a pending job dies at once, a flow top down (a budget
at a time, across queues), an active job is marked and dies when it
reports; and a retry takes the cancel back: the retried parent waits for
its children again, whatever of the cancel was still under way or
undelivered, in whatever order the retry, the sweeps and the running
children come."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from echomq_django import JobState
from echomq_django.core.exceptions import (
    EchoMQError,
    JobCancelled,
    JobNotCancellable,
    JobNotFound,
)
from tests.support import jobkit
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    hash_of,
    jref,
    leaf,
    node,
    ref,
    sweep,
)


def test_cancel_unknown_and_finished(tmq) -> None:
    with pytest.raises(JobNotFound):
        tmq.cancel("q", "nope")
    tmq.enqueue("q", "n", 1, job_id="a")
    complete(tmq, "a", 1)
    with pytest.raises(JobNotCancellable, match="'a' in queue 'q' is completed"):
        tmq.cancel("q", "a")


def test_cancel_a_pending_job(tmq) -> None:
    tmq.enqueue("q", "n", 1, job_id="a")
    report = tmq.cancel("q", "a")
    assert report.state is JobState.PENDING
    assert assert_state(tmq, "q", "a", "dead")["error"] == "cancelled"


def test_cancel_a_flow_top_down(tmq) -> None:
    tmq.add_flow(
        node("p", [node("m", [leaf("x"), leaf("y")]), leaf("c"), leaf("o", queue="other")])
    )
    complete(tmq, "c", 1)
    report = tmq.cancel("q", "p", budget=2)
    assert report.calls > 1
    for job_id in ("p", "m", "x", "y"):
        assert assert_state(tmq, "q", job_id, "dead")["error"] == "cancelled", job_id
    assert assert_state(tmq, "other", "o", "dead")["error"] == "cancelled"
    assert_state(tmq, "q", "c", "completed")


def test_cancel_an_active_job_marks_it(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c", ignore_dependency_on_failure=True)]))
    job = claim_one(tmq, "q", "c")
    assert tmq.cancel("q", "c").state is JobState.ACTIVE
    assert_state(tmq, "q", "c", "active")
    with pytest.raises(JobCancelled):
        tmq.extend_lease(job)
    with pytest.raises(JobCancelled):
        tmq.complete(job, "late")
    assert assert_state(tmq, "q", "c", "dead")["error"] == "cancelled"
    assert_state(tmq, "q", "p", "pending")  # its policy (ignore) applied
    assert hash_of(tmq, tmq.keys.job_part("q", "p", "unsuccessful")) == {ref(tmq, "c"): "cancelled"}


# -- a retry takes a cancel back -----------------------------------------------


def test_a_cancelled_parent_retried_at_once_keeps_its_children(tmq) -> None:
    """cancel reaches x on another queue and kills it there; x's death for
    its parent used to wait in o's outbox for o's pump, so a retry of the
    parent before that sweep retried only c1, and x's death, delivered
    later, killed the retried parent again. cancel delivers that death too
    before it returns."""
    tmq.add_flow(node("p", [leaf("c1"), leaf("x", queue="o")]))
    tmq.cancel("q", "p")
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 0
    assert tmq.dependencies("q", "p").failed == {
        jref("c1"): "cancelled",
        jref("x", "o"): "cancelled",
    }
    tmq.retry("q", "p")
    assert_state(tmq, "o", "x", "pending")
    sweep(tmq, "q", "o")
    assert_state(tmq, "q", "p", "awaiting_children")
    complete(tmq, "c1", 1)
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


def test_a_cancelled_parent_retried_before_a_sweep_keeps_its_retried_child(tmq) -> None:
    """cancel delivers its `cancel` entry for the child on another slot at
    once; delivered again after the parent's retry, it killed the retried
    child a second time and the parent died again."""
    tmq.add_flow(node("p", [leaf("c1"), leaf("x", queue="o")]))
    assert tmq.cancel("q", "p").state is JobState.AWAITING_CHILDREN
    sweep(tmq, "o")  # x's death (fp) reaches p
    assert_state(tmq, "q", "p", "dead")
    assert_state(tmq, "o", "x", "dead")
    tmq.retry("q", "p")
    sweep(tmq, "q", "o")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert_state(tmq, "o", "x", "pending")
    complete(tmq, "x", 2, queue="o")
    complete(tmq, "c1", 1)
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


def test_a_cancelled_parent_retried_while_its_child_runs_waits_for_it(tmq) -> None:
    """p was cancelled while its only child ran: p died, c was marked, and
    p's :failed stayed empty. Its retry used to make p plain pending, so it
    ran without c's result; it waits for c again, and the retry takes c's
    mark back, so c's result counts."""
    tmq.add_flow(node("p", [leaf("c")]))
    job = claim_one(tmq, "q", "c")
    tmq.cancel("q", "p")
    assert assert_state(tmq, "q", "p", "dead")["error"] == "cancelled"
    assert hash_of(tmq, tmq.keys.job("q", "c"))["cancel"]
    outcome = tmq.retry("q", "p")
    assert outcome.state is JobState.AWAITING_CHILDREN
    assert_state(tmq, "q", "p", "awaiting_children")
    assert "cancel" not in hash_of(tmq, tmq.keys.job("q", "c"))
    assert tmq.job_ids("q", "awaiting_children") == ["p"] and tmq.job_ids("q", "dead") == []
    tmq.complete(job, 7)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c"): 7}


def test_a_cancelled_parent_retried_takes_back_its_cancel_still_under_way(tmq, monkeypatch) -> None:
    """p's cancel went a budget at a time and its caller died: the rest of
    p's children wait in the cancel list. A retry of p takes that work back:
    the next prune used to cancel the children the retry had left running,
    and their deaths killed p again."""
    tmq.add_flow(node("p", [leaf(f"c{i}") for i in range(1, 5)]))
    monkeypatch.setattr(type(tmq.lifecycle), "_follow_up", lambda *a, **kw: None)
    tmq.cancel("q", "p", budget=2)
    monkeypatch.undo()
    cancel_list = tmq.keys.queue_key("q", "cancel")
    assert tmq.client.llen(cancel_list) == 1
    cancelled = [i for i in range(1, 5) if jobkit.row(tmq, "q", f"c{i}")["s"] == "dead"]
    assert cancelled == [1, 2]
    tmq.retry("q", "p")
    assert tmq.client.llen(cancel_list) == 0
    tmq.lifecycle.prune("q")
    for i in range(1, 5):
        assert_state(tmq, "q", f"c{i}", "pending")
    assert_state(tmq, "q", "p", "awaiting_children")
    for i in (3, 4, 1, 2):  # the retried ones queue again behind the others
        complete(tmq, f"c{i}", i)
    assert_state(tmq, "q", "p", "pending")
    assert len(tmq.children_values("q", "p")) == 4


def test_a_cancelled_parent_retried_takes_back_its_undelivered_cancel_entries(
    tmq, monkeypatch
) -> None:
    """p's `cancel` entry for x on another slot was not delivered (its
    caller gave up waiting for a sweeping pump, or died): a retry of p takes
    it out of p's outbox, so the next sweep no longer cancels x, whose
    death failed the retried p again."""
    tmq.add_flow(node("p", [leaf("c1"), leaf("x", queue="o")]))
    monkeypatch.setattr(type(tmq.lifecycle), "_follow_up", lambda *a, **kw: None)
    tmq.cancel("q", "p")
    monkeypatch.undo()
    outbox = tmq.keys.queue_key("q", "flow:outbox")
    assert [e["k"] for e in map(json.loads, tmq.client.lrange(outbox, 0, -1))] == ["cancel"]
    row = tmq.keys.job("q", "p")
    assert tmq.client.hget(row, "cancel_out") == b"1"  # the retry's cue to search the outbox
    assert_state(tmq, "o", "x", "pending")
    assert tmq.retry("q", "p").state is JobState.AWAITING_CHILDREN
    assert tmq.client.llen(outbox) == 0
    assert tmq.client.hget(row, "cancel_out") is None
    sweep(tmq, "q", "o")
    assert_state(tmq, "o", "x", "pending")
    assert_state(tmq, "q", "p", "awaiting_children")
    complete(tmq, "c1", 1)
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


def test_a_cancel_entry_leaving_the_outbox_lowers_its_parents_count(tmq, monkeypatch) -> None:
    """`cancel_out` counts p's cancel entries still in its queue's outbox
    (lib/cancel_out.lua): a retry searches the outbox only while it is
    above zero. Delivered at once by the cancel, or trimmed by a sweep, the
    entries take their count with them: no field is left on the row."""
    tmq.add_flow(node("p", [leaf("x", queue="o"), leaf("y", queue="o")]))
    tmq.cancel("q", "p")  # delivered at once (deliver_sent), then forgotten
    row = tmq.keys.job("q", "p")
    assert tmq.client.hget(row, "cancel_out") is None
    assert_state(tmq, "o", "x", "dead")
    tmq.add_flow(node("p2", [leaf("x2", queue="o"), leaf("y2", queue="o")]))
    monkeypatch.setattr(type(tmq.lifecycle), "_follow_up", lambda *a, **kw: None)
    tmq.cancel("q", "p2")
    monkeypatch.undo()
    row2 = tmq.keys.job("q", "p2")
    assert tmq.client.hget(row2, "cancel_out") == b"2"
    sweep(tmq, "q")  # the pump delivers and trims them
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 0
    assert tmq.client.hget(row2, "cancel_out") is None
    assert_state(tmq, "o", "x2", "dead")


@pytest.mark.parametrize(
    "flag",
    ["ignore_dependency_on_failure", "remove_dependency_on_failure", "continue_parent_on_failure"],
)
def test_a_cancelled_parents_retry_leaves_its_resolved_non_fp_children_dead(tmq, flag) -> None:
    """The rule as documented (README "A retry takes a cancel back"): a
    child with id / rd / cp that the cancel killed resolved its parent by
    its policy, like any other death of it; the parent's retry brings back
    only children that failed it (fp), and runs once its running child is
    done, without the resolved one's value."""
    tmq.add_flow(node("p", [leaf("b"), leaf("a", **{flag: True})]))
    job_b = claim_one(tmq, "q", "b")  # b runs, a waits
    tmq.cancel("q", "p")
    assert assert_state(tmq, "q", "a", "dead")["error"] == "cancelled"
    tmq.retry("q", "p")
    tmq.complete(job_b, 2)
    assert_state(tmq, "q", "a", "dead")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("b"): 2}


def test_an_ancestor_a_retry_revives_takes_its_cancel_back_too(tmq) -> None:
    """cancel(r) kills r and p (awaiting) and marks b (running). Retrying p
    revives r through reattach (r's :failed empties): r is awaiting again but
    b keeps r's cancel mark, so b's result is dropped at completion and r
    dies again ('failed by child b: cancelled'). A retry of r itself would
    have taken b's mark back."""
    tmq.add_flow(node("r", [node("p", [leaf("c")]), leaf("b")]))
    job_b = claim_one(tmq, "q", "b")
    tmq.cancel("q", "r")
    assert hash_of(tmq, tmq.keys.job("q", "b")).get("cancel")
    tmq.retry("q", "p")
    assert_state(tmq, "q", "r", "awaiting_children")
    tmq.complete(job_b, 2)  # raises JobCancelled if b kept the mark
    complete(tmq, "c", 1)
    complete(tmq, "p", 1)
    assert_state(tmq, "q", "r", "pending")


@pytest.mark.parametrize("swept_while_dead", [False, True])
def test_a_cancelled_parent_retried_keeps_its_children_deadline(tmq, clock, swept_while_dead):
    """p (children_timeout_ms=1000) is cancelled while its child runs, then
    retried after its deadline: back to awaiting_children (49f1ea1). Whether
    its deadline still holds depends on whether a pump swept while p was
    dead: expire_children dropped p from P:{q}:deadlines then, and the
    retried p waits for ever for a child that never finishes; without that
    sweep it dies at once of 'children timed out'."""
    tmq.add_flow(node("p", [leaf("b")], children_timeout_ms=1000))
    claim_one(tmq, "q", "b", lease_ms=3_600_000)  # runs (and heartbeats) for ever
    tmq.cancel("q", "p")
    clock.advance(2000)
    if swept_while_dead:
        tmq.timers.expire_children("q")
    assert tmq.retry("q", "p").state is JobState.AWAITING_CHILDREN
    clock.advance(2000)
    tmq.timers.expire_children("q")
    assert tmq.state_of("q", "p") is JobState.DEAD  # its deadline held


def test_a_parent_cancelled_after_its_release_is_not_released_twice(tmq) -> None:
    """Found by test_stateful with more examples: c (id) is cancelled, p
    (its only child ignored) is released; p is cancelled while pending. A
    retry of c re-attaches it to the dead p (reattach_ignored: :dependencies
    back to 1), so p's retry sees 'cancelled' with a child unresolved and
    sends p, released once already, back to awaiting_children: c's
    completion releases it a second time (parent_released sent twice)."""
    tmq.add_flow(node("p", [leaf("c", ignore_dependency_on_failure=True)]))
    tmq.cancel("q", "c")
    assert_state(tmq, "q", "p", "pending")  # released: 1
    tmq.cancel("q", "p")
    tmq.retry("q", "c")
    tmq.retry("q", "p")
    complete(tmq, "c", 1)
    assert jobkit.events(tmq, "q", "released").count("p") == 1


# -- an explorer: cancel a mixed flow, retry at every point --------------------


def mixed_flow():
    # a pending, b active, c awaiting (g active); x pending on o, y active on
    # o, z awaiting on o (w active on q)
    return node(
        "p",
        [
            leaf("a"),
            leaf("b"),
            node("c", [leaf("g")]),
            leaf("x", queue="o"),
            leaf("y", queue="o"),
            node("z", [leaf("w")], queue="o"),
        ],
    )


def claim_named(mq, queue, want):
    got, back = {}, []
    for _ in range(20):
        jobs = mq.claim(queue, 1)
        if not jobs:
            break
        j = jobs[0]
        if j.id in want:
            got[j.id] = j
        else:
            back.append(j)
        if set(got) == set(want):
            break
    return got, back


def drain(mq, held, log, retries_left=4):
    """Run everything to the end: complete what runs; retry p when it died.
    p, when claimed, must see every child's value."""
    for _ in range(40):
        sweep(mq, "q", "o")
        moved = False
        for queue in ("q", "o"):
            for j in mq.claim(queue, 10):
                moved = True
                if j.id == "p":
                    vals = mq.children_values("q", "p")
                    assert len(vals) == 6, (log, vals)
                try:
                    mq.complete(j, 1)
                except EchoMQError as err:
                    log.append(f"complete {j.id}: {type(err).__name__}")
        for jid, j in list(held.items()):
            moved = True
            del held[jid]
            try:
                mq.complete(j, 1)
            except EchoMQError as err:
                log.append(f"complete held {jid}: {type(err).__name__}")
        state = mq.state_of("q", "p")
        if state is JobState.COMPLETED:
            return
        if state is JobState.DEAD and not moved:
            assert retries_left > 0, log
            retries_left -= 1
            log.append("retry p (drain)")
            for q, jid in (("q", "p"),):
                mq.retry(q, jid)
    raise AssertionError(("p never finished", mq.state_of("q", "p"), log))


STEPS = ["retry", "sweep", "b", "g", "y", "w"]


ORDERS = list(itertools.permutations(STEPS))
random.Random(7).shuffle(ORDERS)


@pytest.mark.parametrize("order", ORDERS[:60], ids=lambda o: "-".join(o))
def test_cancel_then_retry_in_any_order_runs_p_once_with_all_values(tmq, order) -> None:
    tmq.add_flow(mixed_flow())
    held = {}
    for queue, ids in (("q", {"b", "g", "w"}), ("o", {"y"})):
        got, back = claim_named(tmq, queue, ids)
        assert set(got) == ids
        held.update(got)
        for j in back:  # back to pending without spending the attempt
            tmq.timers.postpone(j, 0)
    tmq.cancel("q", "p")
    log = []
    retried = False
    for step in order:
        log.append(step)
        if step == "retry":
            retried = True
            try:
                tmq.retry("q", "p")
            except EchoMQError as err:
                log.append(f"retry refused {err}")
        elif step == "sweep":
            sweep(tmq, "q", "o")
        else:
            j = held.pop(step)
            try:
                tmq.complete(j, 1)
            except EchoMQError as err:
                log.append(f"complete {step}: {type(err).__name__}")
    assert retried
    drain(tmq, held, log)
    released = jobkit.events(tmq, "q", "released")
    assert released.count("p") == 1, (log, released)
