"""Remove, on both rigs: a job, a child (its parent goes on, or comes back to
life), a parent with its subtree, across queues; and the flow added again
under the same ids afterwards, which lands fresh and runs once: no entry,
completion, death, cancel or removal meant for the removed flow ever
reaches its successor."""

from __future__ import annotations

import pytest

from echomq_django.core.exceptions import (
    FlowConflict,
    JobNotFound,
    JobNotRemovable,
)
from echomq_django.runners.pump import Pump
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    hash_of,
    jref,
    keys_of,
    kill,
    leaf,
    node,
    rows,
    sweep,
    sweep_report,
)


def test_remove_unknown_and_active(tmq) -> None:
    with pytest.raises(JobNotFound):
        tmq.remove("q", "nope")
    tmq.enqueue("q", "n", 1, job_id="a")
    claim_one(tmq, "q", "a")
    with pytest.raises(JobNotRemovable, match="'a' in queue 'q' is active"):
        tmq.remove("q", "a")
    assert_state(tmq, "q", "a", "active")


def test_removed_child_lets_the_parent_go_on(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    complete(tmq, "c1", 1)
    report = tmq.remove("q", "c2")
    assert report.removed == 1 and report.outcome.released == [("q", "p")]
    assert_state(tmq, "q", "p", "pending")
    deps = tmq.dependencies("q", "p")
    assert deps.removed == {jref("c2"): "removed"} and deps.remaining == 0


def test_removing_a_child_that_failed_its_parent_revives_it(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    complete(tmq, "c1", 1)
    kill(tmq, "c2")
    assert_state(tmq, "q", "p", "dead")
    tmq.remove("q", "c2")
    assert_state(tmq, "q", "p", "pending")


def test_remove_a_parent_with_its_subtree(tmq) -> None:
    tmq.add_flow(node("p", [node("m", [leaf("x"), leaf("y")]), leaf("c")]))
    report = tmq.remove("q", "p", budget=2)
    assert report.removed == 5 and report.calls > 1
    assert keys_of(tmq, "q") == []


def test_remove_across_queues(tmq) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="other"), leaf("c")]))
    complete(tmq, "c", 1)
    tmq.remove("other", "x")
    assert_state(tmq, "q", "p", "pending")  # the gone entry was delivered at once
    Pump(["other"], mq=tmq).sweep()  # and again by the pump: a no-op
    assert tmq.dependencies("q", "p").remaining == 0
    tmq.remove("q", "p")
    assert rows(tmq, "q") == [] and rows(tmq, "other") == []
    Pump(["q"], mq=tmq).sweep()  # trims the rm entry sent for x (gone already)
    assert keys_of(tmq, "q") == [] and keys_of(tmq, "other") == []


def test_remove_a_cross_queue_subtree(tmq) -> None:
    tmq.add_flow(node("p", [node("m", [leaf("x", queue="q")], queue="other"), leaf("c")]))
    tmq.remove("q", "p")
    assert rows(tmq, "q") == [] and rows(tmq, "other") == []
    Pump(["q", "other"], mq=tmq).sweep()
    assert keys_of(tmq, "q") == [] and keys_of(tmq, "other") == []


# -- the same ids after a removal ----------------------------------------------


def test_a_removed_flow_added_again_lands_fresh_and_runs_once(tmq) -> None:
    flow = node("p", [leaf("c1"), leaf("c2", queue="other")])
    tmq.add_flow(flow)
    complete(tmq, "c1", 1)
    tmq.remove("q", "p")
    assert rows(tmq, "q") == [] and rows(tmq, "other") == []
    ref_ = tmq.add_flow(flow)
    assert (ref_.landed, ref_.skipped) == (3, 0)
    complete(tmq, "c1", 1)
    complete(tmq, "c2", 2, queue="other")
    Pump(["other"], mq=tmq).sweep()
    complete(tmq, "p", "once")
    assert tmq.job_ids("q", "pending") == [] and tmq.job_ids("other", "pending") == []
    assert tmq.children_values("q", "p") == {jref("c1"): 1, jref("c2", "other"): 2}


def test_a_flow_removed_and_added_again_before_a_sweep_runs_once(tmq) -> None:
    """remove delivers its `rm` entry for the child on another slot at once;
    left in the outbox, the next sweep delivered it again and removed the
    NEW child of the flow added meanwhile, and the new root waited for ever."""
    flow = node("p", [leaf("c1"), leaf("x", queue="o")])
    tmq.add_flow(flow)
    tmq.remove("q", "p")
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 0
    assert tmq.add_flow(flow).landed == 3
    sweep(tmq, "q", "o")
    assert rows(tmq, "o") == ["x"]
    complete(tmq, "c1", 1)
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c1"): 1, jref("x", "o"): 2}


def test_attaching_a_completed_parentless_job_counts_it_at_once(tmq) -> None:
    tmq.enqueue("q", "leaf", {}, job_id="a")
    complete(tmq, "a", 7)
    tmq.enqueue("other", "leaf", {}, job_id="x")
    complete(tmq, "x", 8, queue="other")
    landed = tmq.add_flow(node("p", [leaf("a"), leaf("x", queue="other"), leaf("b")]))
    assert (landed.landed, landed.skipped) == (2, 2)
    if not tmq.cross_queue_scripts:  # a Cluster: x's stored result reaches p through the outbox
        assert tmq.children_values("q", "p") == {jref("a"): 7}
        Pump(["other"], mq=tmq).sweep()
    assert tmq.children_values("q", "p") == {jref("a"): 7, jref("x", "other"): 8}
    assert tmq.get_job("q", "a").parent == "p" and tmq.get_job("other", "x").parent_queue == "q"
    complete(tmq, "b", 9)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.dependencies("q", "p").remaining == 0


def test_attaching_a_job_with_another_live_parent_is_a_conflict(tmq) -> None:

    tmq.add_flow(node("p", [leaf("a")]))
    complete(tmq, "a", 1)
    with pytest.raises(FlowConflict, match="q a exists as job leaf under parent q/p"):
        tmq.add_flow(node("p2", [leaf("a")]))
    assert rows(tmq, "q") == ["a", "p"]


def test_a_new_root_over_children_that_finished_never_waits(tmq, monkeypatch) -> None:
    """c3 and c4 completed; their parent's removal went a budget at a time
    and its process died before it reached them. The flow added again skips
    them, and each tells the new p its stored result. (A child that ran
    when its flow was removed no longer stays: it goes as it finishes,
    tests/test_flow_edges.py.)"""
    flow = node("p", [leaf(f"c{i}") for i in range(1, 5)])
    tmq.add_flow(flow)
    jobs = {j.id: j for j in tmq.claim("q", 4)}
    tmq.fail_many([(jobs["c1"], "again", False), (jobs["c2"], "again", False)])
    tmq.complete_many([(jobs["c3"], 3), (jobs["c4"], 4)])
    interrupted_remove(tmq, monkeypatch, "q", "p")
    assert rows(tmq, "q") == ["c3", "c4"]
    got = tmq.add_flow(flow)  # c3 and c4 are skipped, and tell the new p their results
    assert (got.landed, got.skipped) == (3, 2)
    assert tmq.children_values("q", "p") == {jref("c3"): 3, jref("c4"): 4}
    complete(tmq, "c1", 1)
    complete(tmq, "c2", 2)
    assert_state(tmq, "q", "p", "pending")


# -- an entry meant for a removed flow never reaches its successor -------------


@pytest.mark.via_flow_outbox
def test_an_old_completion_never_reaches_the_flow_added_again(tmq) -> None:
    """x completed on o; its `done` entry still waits in o's outbox when the
    flow is removed and added again. Delivered, it used to count x's old
    result for the new parent, which was released before its new x ran. The
    entry carries the parent's incarnation, the new parent has another."""
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    complete(tmq, "x", "old", queue="o")
    tmq.remove("q", "p")
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 1
    assert tmq.add_flow(flow).landed == 2
    assert sweep_report(tmq, "o")["delivered"] == 1  # delivered as stale: it leaves
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 0
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.dependencies("q", "p").remaining == 1
    assert tmq.children_values("q", "p") == {}
    complete(tmq, "x", "new", queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("x", "o"): "new"}


def test_an_old_death_never_fails_the_flow_added_again(tmq) -> None:
    """The same for a death (fp): the old entry used to kill the new parent."""
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    kill(tmq, "x", "old boom", queue="o")
    tmq.remove("q", "p")
    tmq.add_flow(flow)
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.dependencies("q", "p").failed == {}
    assert_state(tmq, "o", "x", "pending")


def test_an_old_removal_never_takes_the_child_of_the_flow_added_again(tmq, monkeypatch) -> None:
    """remove could not deliver its `rm` for x at once (a pump held q's
    outbox past the wait), so it waits in q's outbox while the flow is added
    again over the still-present x (skipped: the new parent takes it). The
    old `rm` used to remove x, and the new root waited for ever."""
    from echomq_django.protocol import outbox

    monkeypatch.setattr(outbox, "SENT_WAIT_S", 0.0)
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    assert tmq.outbox.lock("q", "a-sweeping-pump", 60_000)
    tmq.remove("q", "p")
    assert tmq.outbox.lock("q", "a-sweeping-pump", 0, take=False)
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 1
    assert tmq.add_flow(flow).skipped == 1
    sweep(tmq, "q")
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 0
    assert_state(tmq, "o", "x", "pending")
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


def test_a_removed_flows_running_child_never_resolves_a_new_flow_of_the_same_id(tmq) -> None:
    """c1 runs when its parent is removed (it is left to finish, marked
    orphaned); a new flow under the same root id but other children lands.
    c1's completion used to count in the new parent's counter and released
    it before c3 ran."""
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    job = claim_one(tmq, "q", "c1")
    tmq.remove("q", "p")
    tmq.add_flow(node("p", [leaf("c3")]))
    tmq.complete(job, "stale")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.dependencies("q", "p").remaining == 1
    assert tmq.children_values("q", "p") == {}
    complete(tmq, "c3", 3)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c3"): 3}


def test_a_removed_flows_running_child_never_fails_a_new_flow_of_the_same_id(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    job = claim_one(tmq, "q", "c1")
    tmq.remove("q", "p")
    tmq.add_flow(node("p", [leaf("c3")]))
    tmq.fail_many([(job, "boom", True)])
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.dependencies("q", "p").failed == {}


def interrupted_remove(mq, monkeypatch, queue: str, job_id: str) -> None:
    """A remove whose process died after its first call: the children its
    budget did not reach wait in the queue's gc list for a later prune."""
    monkeypatch.setattr(type(mq.lifecycle), "_follow_up", lambda *a, **kw: None)
    mq.remove(queue, job_id, budget=2)
    monkeypatch.undo()


def test_a_child_its_removed_parent_has_not_reached_yet_never_resolves_a_new_flow(
    tmq, monkeypatch
) -> None:
    """c3 of the removed p still waits to be removed (its parent's removal
    goes a budget at a time) when a new flow lands under the id p with other
    children; c3 is claimed and completes meanwhile: its result used to count
    in the new p."""
    tmq.add_flow(node("p", [leaf(f"c{i}") for i in range(1, 5)]))
    interrupted_remove(tmq, monkeypatch, "q", "p")
    assert set(rows(tmq, "q")) == {"c3", "c4"}
    tmq.add_flow(node("p", [leaf("n1")]))
    complete(tmq, "c3", "stale")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.children_values("q", "p") == {}
    tmq.lifecycle.prune("q")
    assert "c4" not in rows(tmq, "q")
    complete(tmq, "n1", 1)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("n1"): 1}


def test_children_a_flow_added_again_took_back_outlive_the_old_removal(tmq, monkeypatch) -> None:
    """The same flow added again while its removal is under way takes back
    the children still there (skipped, under the same parent id); the rest
    of the old removal used to remove them, and the new root waited for
    ever."""
    flow = node("p", [leaf(f"c{i}") for i in range(1, 5)])
    tmq.add_flow(flow)
    interrupted_remove(tmq, monkeypatch, "q", "p")
    got = tmq.add_flow(flow)
    assert (got.landed, got.skipped) == (3, 2)
    tmq.lifecycle.prune("q")
    assert rows(tmq, "q") == ["c1", "c2", "c3", "c4", "p"]
    jobs = tmq.claim("q", 10)
    assert sorted(j.id for j in jobs) == ["c1", "c2", "c3", "c4"]
    tmq.complete_many([(j, j.id) for j in jobs])
    assert_state(tmq, "q", "p", "pending")
    assert len(tmq.children_values("q", "p")) == 4


def test_an_old_cancel_never_reaches_the_flow_added_again(tmq, monkeypatch) -> None:
    """p's cancel went a budget at a time and its process died: the rest of
    its children wait in the queue's cancel list. p is then removed and the
    flow added again; the old cancel, continued by the next prune, used to
    cancel the new flow's children."""
    flow = node("p", [leaf(f"c{i}") for i in range(1, 5)])
    tmq.add_flow(flow)
    monkeypatch.setattr(type(tmq.lifecycle), "_follow_up", lambda *a, **kw: None)
    tmq.cancel("q", "p", budget=2)
    monkeypatch.undo()
    assert tmq.client.llen(tmq.keys.queue_key("q", "cancel")) == 1
    tmq.remove("q", "p")
    assert tmq.add_flow(flow).landed == 5
    tmq.lifecycle.prune("q")
    assert tmq.client.llen(tmq.keys.queue_key("q", "cancel")) == 0
    for i in range(1, 5):
        assert_state(tmq, "q", f"c{i}", "pending")
    assert_state(tmq, "q", "p", "awaiting_children")


def test_a_removed_flows_cancel_mark_never_kills_the_flow_added_again(tmq) -> None:
    """c1 ran when its flow was cancelled (marked) and then removed; the
    flow added again takes c1 back. The old mark used to kill c1 at its
    completion, and its death the new parent."""
    flow = node("p", [leaf("c1"), leaf("c2")])
    tmq.add_flow(flow)
    job = claim_one(tmq, "q", "c1")
    tmq.cancel("q", "p")
    tmq.remove("q", "p")
    assert tmq.add_flow(flow).skipped == 1
    assert "cancel" not in hash_of(tmq, tmq.keys.job("q", "c1"))
    tmq.complete(job, 1)
    complete(tmq, "c2", 2)
    assert_state(tmq, "q", "p", "pending")
