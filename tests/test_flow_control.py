"""A parent's hold on its children, changed on the way, on both rigs: a
child with ``continue_parent_on_failure`` releases its parent at once when
it dies; ``remove_child_dependency`` and ``remove_unprocessed_children``
let a parent stop waiting; ``children_timeout_ms`` kills a parent whose
children take too long, and its policy applies upward."""

from __future__ import annotations

import pytest

from echomq_django import DependencyError, JobNotActive, JobNotFound
from echomq_django.runners.pump import Pump
from tests.support import jobkit
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    counter,
    hash_of,
    jref,
    kill,
    leaf,
    node,
    ref,
    snapshot,
)

# -- continue_parent_on_failure ------------------------------------------------


@pytest.mark.parametrize("child_queue", ["q", "other"])
def test_continue_parent_on_failure_releases_the_parent_at_once(tmq, child_queue) -> None:
    tmq.add_flow(
        node(
            "p",
            [leaf("c1", queue=child_queue, continue_parent_on_failure=True), leaf("c2")],
        )
    )
    kill(tmq, "c1", queue=child_queue)
    Pump([child_queue], mq=tmq).sweep()
    assert_state(tmq, "q", "p", "pending")
    deps = tmq.dependencies("q", "p")
    assert (deps.ignored, deps.failed, deps.unprocessed, deps.remaining) == (
        {jref("c1", child_queue): "boom"},
        {},
        [jref("c2")],
        1,
    )
    tmq.complete(claim_one(tmq, "q", "p"), "went on")  # a released parent goes first
    assert complete(tmq, "c2", 2).released == []  # released once only
    assert_state(tmq, "q", "p", "completed")
    assert counter(tmq, "q", "p") == 0  # never below 0


def test_a_continued_parent_that_dies_of_its_own_error_retries_alone(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1", continue_parent_on_failure=True), leaf("c2")]))
    kill(tmq, "c1")
    kill(tmq, "p", "own error")  # released at once, ahead of c2; then it dies itself
    assert tmq.retry("q", "p").state.value == "pending"  # no child failed it: back it goes
    tmq.retry("q", "c1")
    jobs = tmq.claim("q", 5)
    assert [j.id for j in jobs] == ["c2", "p", "c1"]
    assert [tmq.complete(j, j.id).released for j in jobs] == [[], [], []]
    assert tmq.dependencies("q", "p").ignored == {jref("c1"): "boom"}
    assert tmq.children_values("q", "p") == {jref("c2"): "c2"}


# -- remove_child_dependency ---------------------------------------------------


@pytest.mark.parametrize("child_queue", ["q", "other"])
def test_remove_child_dependency_releases_a_parent_waiting_only_for_it(tmq, child_queue) -> None:
    tmq.add_flow(node("p", [leaf("c1", queue=child_queue), leaf("c2")]))
    complete(tmq, "c2" if child_queue == "other" else "c1", 1)
    gone = jref("c1", child_queue) if child_queue == "other" else jref("c2")
    outcome = tmq.remove_child_dependency("q", "p", gone)
    assert outcome.released == [("q", "p")]
    assert_state(tmq, "q", "p", "pending")
    assert hash_of(tmq, ref(tmq, "p") + ":removed") == {tmq.keys.job(*gone): "dependency removed"}
    assert tmq.dependencies("q", "p").removed == {gone: "dependency removed"}
    # the child still runs; finishing later changes nothing for the parent
    cq, cid = gone
    if cq == "q":
        tmq.complete(claim_one(tmq, "q", "p"), "p")  # the released parent goes first
    complete(tmq, cid, "late", queue=cq)
    Pump([cq], mq=tmq).sweep()
    assert (counter(tmq, "q", "p"), tmq.children_values("q", "p")) == (
        0,
        {jref("c2" if child_queue == "other" else "c1"): 1},
    )


def test_remove_child_dependency_refuses_what_it_cannot_do(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    complete(tmq, "c1")
    before = snapshot(tmq.client)
    with pytest.raises(DependencyError) as refused:
        tmq.remove_child_dependency("q", "p", jref("c1"))
    assert (
        str(refused.value) == "parent 'p' in queue 'q': child q/c1 has resolved its parent already"
    )
    with pytest.raises(DependencyError) as refused:
        tmq.remove_child_dependency("q", "p", ("q", "x"))
    assert str(refused.value) == "parent 'p' in queue 'q': child q/x is not a child of this parent"
    with pytest.raises(JobNotFound):
        tmq.remove_child_dependency("q", "nope", jref("c1"))
    with pytest.raises(ValueError, match="^invalid job ref 'c2': write 'queue/id'"):
        tmq.remove_child_dependency("q", "p", "c2")
    assert snapshot(tmq.client) == before
    complete(tmq, "c2")
    with pytest.raises(JobNotActive, match="is pending"):
        tmq.remove_child_dependency("q", "p", "q/c2")


# -- remove_unprocessed_children -----------------------------------------------


def test_remove_unprocessed_children_on_two_queues(tmq, clock) -> None:
    tmq.add_flow(
        node(
            "p",
            [
                leaf("a"),
                leaf("b"),
                leaf("c", queue="other"),
                leaf("d", queue="other", delay_ms=50),
                node("m", [leaf("x", queue="other")], queue="other"),
            ],
        )
    )
    running = claim_one(tmq, "q", "a")
    deleted, outcome = tmq.remove_unprocessed_children("q", "p")
    assert sorted(deleted) == [("other", "c"), ("other", "d"), ("q", "b")]
    assert outcome.released == []  # a runs, m waits for x
    for q, i in deleted:
        assert not tmq.client.exists(tmq.keys.job(q, i))
        assert jobkit.where(tmq, q, i) == []
    assert counter(tmq, "q", "p") == 2
    tmq.complete(running, "A")
    complete(tmq, "x", queue="other")
    Pump(["other"], mq=tmq).sweep()
    complete(tmq, "m", queue="other")
    Pump(["other"], mq=tmq).sweep()
    assert_state(tmq, "q", "p", "pending")


def test_remove_unprocessed_children_leaves_a_parent_its_children_released(tmq) -> None:
    """m's own child finished, so m is pending again: deleting its row alone
    left its :children and :processed behind; it is waited for instead."""
    tmq.add_flow(node("p", [leaf("a"), node("m", [leaf("x", queue="other")])]))
    complete(tmq, "x", queue="other")
    Pump(["other"], mq=tmq).sweep()
    assert_state(tmq, "q", "m", "pending")
    deleted, outcome = tmq.remove_unprocessed_children("q", "p")
    assert (deleted, outcome.released) == ([jref("a")], [])
    assert counter(tmq, "q", "p") == 1
    assert tmq.children_values("q", "m") == {jref("x", "other"): None}
    assert complete(tmq, "m").released == [("q", "p")]


def test_remove_unprocessed_children_of_a_missing_parent(tmq) -> None:
    with pytest.raises(JobNotFound):
        tmq.remove_unprocessed_children("q", "nope")


# -- children_timeout_ms -------------------------------------------------------


def test_children_timeout_kills_the_parent_and_its_policy_applies_upward(tmq, clock) -> None:
    tmq.add_flow(
        node("r", [node("p", [leaf("c1"), leaf("c2")], children_timeout_ms=1000), leaf("y")])
    )
    complete(tmq, "y")
    complete(tmq, "c1")
    clock.advance(999)
    assert tmq.timers.expire_children("q")[0] == 0
    clock.advance(1)
    expired, outcome = tmq.timers.expire_children("q")
    assert (expired, outcome.dead) == (1, [("q", "p"), ("q", "r")])
    assert outcome.flow_failed == [("q", "r")]
    assert tmq.get_job("q", "p").error == "children timed out"
    assert_state(tmq, "q", "r", "dead")
    assert tmq.client.zcard(tmq.keys.queue_key("q", "deadlines")) == 0
    assert complete(tmq, "c2").released == []  # a dead parent is never released


def test_a_parent_released_in_time_leaves_the_deadlines(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1")], children_timeout_ms=1000))
    assert tmq.client.zcard(tmq.keys.queue_key("q", "deadlines")) == 1
    complete(tmq, "c1")
    assert tmq.client.zcard(tmq.keys.queue_key("q", "deadlines")) == 0
    clock.advance(5000)
    assert tmq.timers.expire_children("q")[0] == 0
    assert_state(tmq, "q", "p", "pending")


def test_a_cross_queue_parent_times_out_on_its_own_slot(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1", queue="other")], children_timeout_ms=10))
    clock.advance(10)
    assert tmq.timers.expire_children("q")[0] == 1
    complete(tmq, "c1", queue="other")
    Pump(["other"], mq=tmq).sweep()  # delivered, recorded, nothing released
    assert_state(tmq, "q", "p", "dead")
    assert tmq.children_values("q", "p") == {jref("c1", "other"): None}
