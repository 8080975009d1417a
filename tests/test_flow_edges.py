"""Three edges of flows, on both rigs (docs/explanation/lifecycle.md):

* a removed flow's running nodes go as they finish, on the removed root's
  slot and on another (``#a-removed-flows-running-nodes``);
* a child its parent ignored cannot be retried once the parent went on, on
  its parent's slot or another (``#retrying-a-child-its-parent-ignored``);
* a cancelled parent retried while its child on another slot still runs
  waits for that child and runs once
  (``#a-retried-parent-and-its-running-child-on-another-slot``).
"""

from __future__ import annotations

import json

import pytest

from echomq_django.core.exceptions import JobCancelled, JobNotFound, JobNotRetryable
from echomq_django.core.jobs import JobState
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    events,
    jref,
    keys_of,
    kill,
    leaf,
    node,
    rows,
    snapshot,
    sweep,
)

# -- a removed flow's running nodes go as they finish ---------------------------


def leftovers(mq, queue: str) -> list[str]:
    """The queue's keys but its durable signals stream (keys_of)."""
    return [k for k in keys_of(mq, queue) if not k.endswith(":signals")]


def signals(mq, queue: str) -> list[tuple[str, str]]:
    """(kind, job id) of the durable signal events recorded on ``queue``."""
    return [(e.kind, e.job_id) for e in mq.signal_events.read(queue, 100)]


@pytest.mark.parametrize("queue", ["q", "o"], ids=["same-slot", "cross-slot"])
def test_a_removed_flows_running_child_goes_when_it_completes(tmq, queue) -> None:
    """It used to stay a completed row, parentless, until retention took it
    (up to a day by the default). job_completed is still sent: the handler
    ran; then the row goes, with a `removed` event for the mirror."""
    tmq.signal_events.subscribe([queue], ["completed"])
    tmq.add_flow(node("p", [leaf("c1", queue=queue), leaf("c2")]))
    job = claim_one(tmq, queue, "c1")
    tmq.remove("q", "p")
    assert rows(tmq, queue) == ["c1"]
    assert_state(tmq, queue, "c1", "active")
    outcome = tmq.complete(job, 1)
    assert outcome.released == [] and outcome.outbox == 0
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert leftovers(tmq, "q") == [] and leftovers(tmq, "o") == []
    assert signals(tmq, queue) == [("completed", "c1")]
    assert events(tmq, queue, "removed")[-1] == "c1"
    # a replay of that very call (a reply lost) answers as the first did
    assert tmq.complete(job, 1).state is JobState.COMPLETED
    with pytest.raises(Exception, match="not found"):
        tmq.complete(job, 2)  # another result is no replay


@pytest.mark.parametrize("queue", ["q", "o"], ids=["same-slot", "cross-slot"])
def test_a_removed_flows_running_child_goes_when_it_dies(tmq, queue) -> None:
    tmq.signal_events.subscribe([queue], ["dead"])
    tmq.add_flow(node("p", [leaf("c1", queue=queue, max_attempts=2, backoff_ms=0)]))
    job = claim_one(tmq, queue, "c1")
    tmq.remove("q", "p")
    # a failure with attempts left is no finish: it stays for its next attempt
    assert tmq.fail_many([(job, "once", False)])[0].state is JobState.PENDING
    assert rows(tmq, queue) == ["c1"]
    job = claim_one(tmq, queue, "c1")
    outcome = tmq.fail_many([(job, "boom", False)])[0]
    assert outcome.state is JobState.DEAD and outcome.dead == [(queue, "c1")]
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert leftovers(tmq, "q") == [] and leftovers(tmq, "o") == []
    assert signals(tmq, queue) == [("dead", "c1")]
    assert tmq.fail_many([(job, "boom", False)])[0].state is JobState.DEAD  # a replay


def test_a_removed_flows_running_child_goes_when_its_lease_runs_out(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    claim_one(tmq, "o", "x", lease_ms=1000)
    tmq.remove("q", "p")
    clock.advance(2000)
    assert tmq.timers.recover_stalled("o", max_stalls=0).dead == [("o", "x")]
    assert rows(tmq, "o") == [] and leftovers(tmq, "o") == []


def test_a_removed_flows_running_parent_goes_with_its_subtree(tmq) -> None:
    """m went on without c (its other child continued it, `cp`) and runs
    when the root is removed: it goes as it completes, and its children
    (d dead, c still pending) at the next prune."""
    tmq.add_flow(
        node(
            "p",
            [node("m", [leaf("d", continue_parent_on_failure=True), leaf("c", queue="o")])],
        )
    )
    kill(tmq, "d")
    job = claim_one(tmq, "q", "m")
    tmq.remove("q", "p")
    assert rows(tmq, "q") == ["d", "m"] and rows(tmq, "o") == ["c"]
    tmq.complete(job, 1)
    assert rows(tmq, "q") == ["d"]  # m's children go through the gc list
    tmq.lifecycle.prune("q")
    assert rows(tmq, "q") == []
    assert rows(tmq, "o") == []
    assert leftovers(tmq, "q") == [] and leftovers(tmq, "o") == []


def test_a_removed_flows_running_child_under_the_flow_added_again_stays(tmq) -> None:
    """Taken back by the flow added again, it is no orphan any more: it
    completes into its new parent."""
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    job = claim_one(tmq, "o", "x")
    tmq.remove("q", "p")
    assert tmq.add_flow(flow).skipped == 1
    tmq.complete(job, 5)
    sweep(tmq, "o")
    assert_state(tmq, "o", "x", "completed")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("x", "o"): 5}


# -- retrying a child its parent ignored ----------------------------------------


def ignored_child_of_a_parent_that_went_on(mq, queue: str) -> None:
    """p waits for x (ignore, on ``queue``) and c; x dies, p ignores it; c
    completes and p goes on without x."""
    mq.add_flow(node("p", [leaf("x", queue=queue, ignore_dependency_on_failure=True), leaf("c")]))
    kill(mq, "x", queue=queue)
    sweep(mq, queue)
    assert mq.dependencies("q", "p").ignored == {jref("x", queue): "boom"}
    complete(mq, "c", 1)
    assert_state(mq, "q", "p", "pending")


@pytest.mark.parametrize("queue", ["q", "o"], ids=["same-slot", "cross-slot"])
def test_a_child_its_parent_ignored_and_went_on_without_is_not_retried(tmq, queue) -> None:
    """Across slots the retry used to be accepted: x ran again and its result
    reached nobody. Both now refuse with the same words, writing nothing."""
    ignored_child_of_a_parent_that_went_on(tmq, queue)
    before = snapshot(tmq.client)
    with pytest.raises(JobNotRetryable) as refused:
        tmq.retry(queue, "x")
    assert str(refused.value) == (
        f"job 'x' in queue '{queue}' cannot be retried: its parent q/p ignored its death and "
        "is pending now (it went on without it; a child its parent ignored re-attaches only "
        "while the parent waits)"
    )
    assert snapshot(tmq.client) == before
    assert_state(tmq, queue, "x", "dead")


@pytest.mark.parametrize("queue", ["q", "o"], ids=["same-slot", "cross-slot"])
def test_a_child_its_waiting_parent_ignored_is_counted_again_when_retried(tmq, queue) -> None:
    """While p still waits, the retry re-attaches x at once: c's completion
    no longer releases p, x's does, and p holds x's result."""
    tmq.add_flow(node("p", [leaf("x", queue=queue, ignore_dependency_on_failure=True), leaf("c")]))
    kill(tmq, "x", queue=queue)
    sweep(tmq, queue)
    assert tmq.retry(queue, "x").state is JobState.PENDING
    assert tmq.dependencies("q", "p").ignored == {}
    assert tmq.dependencies("q", "p").remaining == 2
    complete(tmq, "c", 1)
    assert_state(tmq, "q", "p", "awaiting_children")
    complete(tmq, "x", 2, queue=queue)
    sweep(tmq, queue)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c"): 1, jref("x", queue): 2}


def test_a_child_gone_after_its_parents_half_of_the_retry_resolves_its_parent(
    tmq, monkeypatch
) -> None:
    """The parent's half ran (x counted again) and x's row was gone before
    its own half (removed: its `gone` delivery had found x ignored already,
    a no-op). The retry raises JobNotFound and undoes the re-count: x is
    resolved as removed, and p does not wait for ever."""
    tmq.add_flow(node("p", [leaf("x", queue="o", ignore_dependency_on_failure=True), leaf("c")]))
    kill(tmq, "x", queue="o")
    sweep(tmq, "o")
    lifecycle = type(tmq.lifecycle)
    first = lifecycle._reattach_ignored

    def then_gone(self, queue, job_id):
        undo = first(self, queue, job_id)
        self.client.delete(self.keys.job(queue, job_id))
        return undo

    monkeypatch.setattr(lifecycle, "_reattach_ignored", then_gone)
    with pytest.raises(JobNotFound):
        tmq.retry("o", "x")
    deps = tmq.dependencies("q", "p")
    assert (deps.ignored, deps.removed, deps.remaining) == ({}, {jref("x", "o"): "removed"}, 1)
    complete(tmq, "c", 1)
    assert_state(tmq, "q", "p", "pending")


# -- a retried parent and its running child on another slot ---------------------


def cancelled_while_x_runs(mq):
    """p waits for c (done) and x (on o, running); p is cancelled: it dies,
    x is marked. Returns x's Job."""
    mq.add_flow(node("p", [leaf("x", queue="o"), leaf("c")]))
    complete(mq, "c", 1)
    job = claim_one(mq, "o", "x")
    assert mq.cancel("q", "p").state is JobState.AWAITING_CHILDREN
    assert_state(mq, "q", "p", "dead")
    assert_state(mq, "o", "x", "active")
    return job


def test_a_retried_parent_outlives_its_running_childs_cancel_on_another_slot(tmq) -> None:
    """p is retried while x still runs; x's result comes after and is the
    cancel's (dropped, x dies `cancelled`). Its death used to kill p again.
    p waits again, so x runs once more, and p runs once x is done."""
    job = cancelled_while_x_runs(tmq)
    assert tmq.retry("q", "p").state is JobState.AWAITING_CHILDREN
    with pytest.raises(JobCancelled, match="was cancelled"):
        tmq.complete(job, "late")
    assert_state(tmq, "o", "x", "dead")
    sweep(tmq, "o")  # x's death reaches p, which waits again: x runs again
    sweep(tmq, "q")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.dependencies("q", "p").failed == {}
    assert_state(tmq, "o", "x", "pending")
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c"): 1, jref("x", "o"): 2}
    complete(tmq, "p", "once")
    assert tmq.job_ids("q", "pending") == [] and tmq.job_ids("o", "pending") == []


def test_a_running_childs_cancel_that_reached_its_parent_before_the_retry_is_retried(
    tmq,
) -> None:
    """x died of the mark before p's retry: its death reached p while p was
    dead (in p's failed), and p's retry retries x with it."""
    job = cancelled_while_x_runs(tmq)
    with pytest.raises(JobCancelled):
        tmq.complete(job, "late")
    sweep(tmq, "o")
    assert tmq.dependencies("q", "p").failed == {jref("x", "o"): "cancelled"}
    tmq.retry("q", "p")
    assert_state(tmq, "o", "x", "pending")
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


def test_a_child_cancelled_on_its_own_still_fails_its_parent(tmq) -> None:
    """Only a mark its parent's cancel left is taken back by the parent's
    retry: x cancelled by id fails p (fp) as any death."""
    tmq.add_flow(node("p", [leaf("x", queue="o"), leaf("c")]))
    job = claim_one(tmq, "o", "x")
    assert tmq.cancel("o", "x").state is JobState.ACTIVE
    with pytest.raises(JobCancelled):
        tmq.complete(job, "late")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "dead")
    assert tmq.dependencies("q", "p").failed == {jref("x", "o"): "cancelled"}


def test_a_release_cannot_slip_between_the_check_and_the_re_count(tmq, monkeypatch) -> None:
    """c, p's last other child, completes between the parent's half of x's
    retry and x's own half: p is not released (it counts x again already),
    and x's result reaches it. A check read from the host before the retry
    let p go on here, and x ran for nobody."""
    tmq.add_flow(node("p", [leaf("x", queue="o", ignore_dependency_on_failure=True), leaf("c")]))
    kill(tmq, "x", queue="o")
    sweep(tmq, "o")
    lifecycle = type(tmq.lifecycle)
    first = lifecycle._reattach_ignored

    def then_c_completes(self, queue, job_id):
        undo = first(self, queue, job_id)
        complete(tmq, "c", 1)
        return undo

    monkeypatch.setattr(lifecycle, "_reattach_ignored", then_c_completes)
    assert tmq.retry("o", "x").state is JobState.PENDING
    assert_state(tmq, "q", "p", "awaiting_children")
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.children_values("q", "p") == {jref("c"): 1, jref("x", "o"): 2}


def test_a_cancel_entry_a_pump_read_before_the_retry_never_kills_the_retried_parent(
    tmq, monkeypatch
) -> None:
    """A pump's sweep read p's `cancel` entry for x (queued on o) and
    delivers it only after p's retry took the cancel back: x dies of it,
    and its death used to kill p again. It reaches p as the cancel's, and x
    runs again."""
    from echomq_django.protocol import outbox

    monkeypatch.setattr(outbox, "SENT_WAIT_S", 0.0)
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    assert tmq.outbox.lock("q", "a-sweeping-pump", 60_000)
    tmq.cancel("q", "p")
    read = tmq.outbox.head("q", 10)  # what the sweeping pump read
    assert len(read) == 1
    assert tmq.retry("q", "p").state is JobState.AWAITING_CHILDREN
    assert tmq.outbox.length("q") == 0  # the retry took it back, but the pump has it
    tmq.outbox.deliver([json.loads(read[0])])
    assert tmq.outbox.lock("q", "a-sweeping-pump", 0, take=False)
    assert_state(tmq, "o", "x", "dead")
    sweep(tmq, "o")
    sweep(tmq, "q")
    assert_state(tmq, "q", "p", "awaiting_children")
    assert_state(tmq, "o", "x", "pending")
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")
