"""Failure policies and retry-by-id in same-queue flows, on both rigs. A
child's policy decides what its death
does to its parent; every road to death applies it; retry re-attaches."""

from __future__ import annotations

import pytest

from echomq_django import Flow, JobNotRetryable, JobRef, JobState
from echomq_django.runners.pump import Pump
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    counter,
    events,
    hash_of,
    jref,
    kill,
    leaf,
    node,
    ref,
)


def resolutions(mq, pid: str) -> tuple[dict, dict, dict, dict]:
    """The parent's processed, failed, unsuccessful and removed hashes."""
    key = ref(mq, pid)
    return tuple(
        hash_of(mq, f"{key}:{part}") for part in ("processed", "failed", "unsuccessful", "removed")
    )


def failed_by(mq, child: str, error: str = "boom") -> str:
    """A parent's error as its Redis row holds it: the child's key."""
    return f"failed by child {ref(mq, child)}: {error}"


def shown(child: str, error: str = "boom") -> str:
    """A parent's error as the public API shows it: the child as ``q/id``."""
    return f"failed by child q/{child}: {error}"


def test_fail_parent_kills_the_parent_and_records_the_child(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    outcome = kill(tmq, "c1")
    assert (outcome.dead, outcome.flow_failed) == ([("q", "c1"), ("q", "p")], [("q", "p")])
    r = assert_state(tmq, "q", "p", "dead")
    assert (r["error"], r["finished_at"]) == (failed_by(tmq, "c1"), str(clock.now))
    assert resolutions(tmq, "p") == ({}, {ref(tmq, "c1"): "boom"}, {}, {})
    assert counter(tmq, "q", "p") == 2  # an fp child stays counted, for a retry


def test_fail_parent_cascades_to_the_root(tmq) -> None:
    tmq.add_flow(node("r", [node("m", [node("n", [leaf("x")])]), leaf("y")]))
    complete(tmq, "y", "y")  # y is ahead of x (breadth first)
    outcome = kill(tmq, "x")
    assert outcome.flow_failed == [("q", "n"), ("q", "m"), ("q", "r")]
    for pid, child in (("n", "x"), ("m", "n"), ("r", "m")):
        assert_state(tmq, "q", pid, "dead")
        assert list(resolutions(tmq, pid)[1]) == [ref(tmq, child)]
    assert tmq.get_job("q", "r").error == shown("m", shown("n", shown("x")))
    assert tmq.dependencies("q", "r").failed == {jref("m"): shown("n", shown("x"))}
    assert resolutions(tmq, "r")[0] == {ref(tmq, "y"): '"y"'}


TRACEBACK = (
    "CardDeclined: card ending 0000 was declined\n"
    "Traceback (most recent call last):\n"
    '  File "shop/jobs.py", line 12, in charge\n'
    "    raise CardDeclined(card)\n"
    "CardDeclined: card ending 0000 was declined"
)


def test_a_parent_holds_its_childs_summary_not_a_copy_of_its_traceback(tmq) -> None:
    """The parent's error is the child's ref and the first line of its error;
    the whole error stays in the child's row and the parent's :failed, and
    the parent's flow_failed / dead signals carry the parent's error."""
    tmq.add_flow(node("r", [node("p", [leaf("c")])]))
    tmq.client.sadd(tmq.keys.queue_key("q", "signals:kinds"), "flow_failed", "dead")
    kill(tmq, "c", TRACEBACK)
    summary = "CardDeclined: card ending 0000 was declined"
    assert assert_state(tmq, "q", "c", "dead")["error"] == TRACEBACK
    assert assert_state(tmq, "q", "p", "dead")["error"] == failed_by(tmq, "c", summary)
    assert resolutions(tmq, "p")[1] == {ref(tmq, "c"): TRACEBACK}
    chain = failed_by(tmq, "p", failed_by(tmq, "c", summary))
    assert tmq.get_job("q", "r").error == shown("p", shown("c", summary))
    assert resolutions(tmq, "r")[1] == {ref(tmq, "p"): failed_by(tmq, "c", summary)}
    signals = tmq.client.xrange(tmq.keys.queue_key("q", "signals"))
    assert [(f[b"k"], f[b"id"], f[b"v"].decode()) for _, f in signals] == [
        (b"dead", b"c", TRACEBACK),
        (b"flow_failed", b"p", failed_by(tmq, "c", summary)),
        (b"dead", b"p", failed_by(tmq, "c", summary)),
        (b"flow_failed", b"r", chain),
        (b"dead", b"r", chain),
    ]


def test_a_parent_on_another_slot_holds_its_childs_summary_too(tmq) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="other")]))
    kill(tmq, "x", TRACEBACK, queue="other")
    Pump(["other"], mq=tmq).sweep()  # the death entry carries the whole error
    x = ref(tmq, "x", "other")
    summary = "CardDeclined: card ending 0000 was declined"
    assert assert_state(tmq, "q", "p", "dead")["error"] == f"failed by child {x}: {summary}"
    assert resolutions(tmq, "p")[1] == {x: TRACEBACK}


def test_a_parent_holds_at_most_1000_characters_of_its_childs_summary(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c")]))
    long = "E: " + "x" * 1200
    kill(tmq, "c", long + "\nTraceback (most recent call last):")
    error = tmq.get_job("q", "p").error
    assert error == shown("c", long[:997] + "...")
    assert len(error) == len(shown("c", "")) + 1000


def test_ignore_dependency_records_decrements_and_releases(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1", ignore_dependency_on_failure=True), leaf("c2")]))
    assert kill(tmq, "c1").released == []
    assert_state(tmq, "q", "p", "awaiting_children")
    assert (counter(tmq, "q", "p"), resolutions(tmq, "p")) == (
        1,
        ({}, {}, {ref(tmq, "c1"): "boom"}, {}),
    )
    assert complete(tmq, "c2", 2).released == [("q", "p")]
    assert tmq.ignored_failures("q", "p") == {jref("c1"): "boom"}
    assert tmq.children_values("q", "p") == {jref("c2"): 2}


def test_remove_dependency_decrements_without_a_record(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1", remove_dependency_on_failure=True), leaf("c2")]))
    kill(tmq, "c1")
    assert counter(tmq, "q", "p") == 1
    processed, failed, ignored, _ = resolutions(tmq, "p")
    assert (processed, failed, ignored) == ({}, {}, {})
    assert tmq.ignored_failures("q", "p") == {}
    assert kill(tmq, "c2").flow_failed == [("q", "p")]  # c2 is fp


@pytest.mark.parametrize(
    "flags",
    [
        {"ignore_dependency_on_failure": True, "remove_dependency_on_failure": True},
        {"ignore_dependency_on_failure": True, "fail_parent_on_failure": True},
    ],
)
def test_ignore_wins_when_flags_are_combined(tmq, flags) -> None:
    tmq.add_flow(node("p", [leaf("c1", **flags)]))
    assert tmq.get_job("q", "c1").parent_policy == "id"
    assert kill(tmq, "c1").released == [("q", "p")]
    assert resolutions(tmq, "p")[2] == {ref(tmq, "c1"): "boom"}


def test_policy_is_not_consulted_on_completion(tmq) -> None:
    tmq.add_flow(
        node(
            "p",
            [
                leaf("a"),
                leaf("b", ignore_dependency_on_failure=True),
                leaf("c", remove_dependency_on_failure=True),
            ],
        )
    )
    for cid in ("a", "b", "c"):
        complete(tmq, cid, cid)
    assert resolutions(tmq, "p") == ({ref(tmq, i): f'"{i}"' for i in "abc"}, {}, {}, {})
    assert_state(tmq, "q", "p", "pending")


def test_a_dead_parent_is_not_released_by_late_siblings(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2"), leaf("c3", ignore_dependency_on_failure=True)]))
    kill(tmq, "c1")
    assert complete(tmq, "c2", "late").released == []
    assert kill(tmq, "c3", "also").released == []
    assert_state(tmq, "q", "p", "dead")
    assert resolutions(tmq, "p") == (
        {ref(tmq, "c2"): '"late"'},
        {ref(tmq, "c1"): "boom"},
        {ref(tmq, "c3"): "also"},
        {},
    )
    assert (counter(tmq, "q", "p"), events(tmq, "q", "released")) == (1, [])
    assert tmq.claim("q") == []


def die_by_attempts(mq, clock) -> None:
    for _ in range(2):
        mq.fail(claim_one(mq, "q", "c1"), "boom")
        clock.advance(10_000)
        mq.timers.promote_delayed("q")


def die_by_stalls(mq, clock) -> None:
    for _ in range(2):
        claim_one(mq, "q", "c1", lease_ms=5)
        clock.advance(6)
        mq.timers.recover_stalled("q", max_stalls=1)
    assert mq.get_job("q", "c1").error == "stalled 2 times (lease expired; limit 1)"


def die_by_flag(mq, clock) -> None:
    mq.fail(claim_one(mq, "q", "c1"), "boom", dead=True)


@pytest.mark.parametrize(
    "road", [die_by_attempts, die_by_stalls, die_by_flag], ids=["attempts", "stalls", "dead-flag"]
)
@pytest.mark.parametrize(
    "policy, flags",
    [
        ("fp", {}),
        ("id", {"ignore_dependency_on_failure": True}),
        ("rd", {"remove_dependency_on_failure": True}),
    ],
)
def test_every_road_to_death_applies_the_policy(tmq, clock, road, policy, flags) -> None:
    tmq.add_flow(node("p", [leaf("c1", max_attempts=2, **flags)]))
    road(tmq, clock)
    assert_state(tmq, "q", "c1", "dead")
    parent = {"fp": "dead", "id": "pending", "rd": "pending"}[policy]
    assert_state(tmq, "q", "p", parent)
    hashes = resolutions(tmq, "p")
    recorded = {"fp": 1, "id": 2, "rd": 3}[policy]
    assert [bool(h) for h in hashes] == [i == recorded for i in range(4)]
    assert counter(tmq, "q", "p") == (1 if policy == "fp" else 0)


def test_retry_reattaches_a_dead_child_to_its_parent(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1", max_attempts=1), leaf("c2")]))
    kill(tmq, "c1")
    complete(tmq, "c2", "two")
    outcome = tmq.retry("q", "c1")
    assert (outcome.state, outcome.retried, outcome.revived) == (
        JobState.PENDING,
        [("q", "c1")],
        [("q", "p")],
    )
    assert_state(tmq, "q", "p", "awaiting_children")
    assert (counter(tmq, "q", "p"), resolutions(tmq, "p")[1]) == (1, {})
    assert "error" not in hash_of(tmq, ref(tmq, "p"))
    assert assert_state(tmq, "q", "c1", "pending")["attempts"] == "0"
    assert complete(tmq, "c1", "one").released == [("q", "p")]
    assert tmq.children_values("q", "p") == {jref("c1"): "one", jref("c2"): "two"}
    assert events(tmq, "q", "released") == ["p"]


def test_retrying_one_of_two_failed_children_keeps_the_parent_dead(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    kill(tmq, "c1")
    kill(tmq, "c2", "bang")
    assert tmq.retry("q", "c1").revived == []
    assert_state(tmq, "q", "p", "dead")
    assert resolutions(tmq, "p")[1] == {ref(tmq, "c2"): "bang"}
    assert tmq.retry("q", "c2").revived == [("q", "p")]
    assert (counter(tmq, "q", "p"), tmq.job_ids("q", "pending")) == (2, ["c1", "c2"])


def test_retrying_a_parent_retries_the_children_that_failed_it(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2"), leaf("c3")]))
    kill(tmq, "c1")
    kill(tmq, "c2")
    complete(tmq, "c3", 3)
    outcome = tmq.retry("q", "p")
    assert outcome.state is JobState.AWAITING_CHILDREN
    assert (sorted(outcome.retried), outcome.revived) == ([("q", "c1"), ("q", "c2")], [("q", "p")])
    assert_state(tmq, "q", "p", "awaiting_children")
    assert (counter(tmq, "q", "p"), resolutions(tmq, "p")[1]) == (2, {})
    complete(tmq, "c1", 1)
    assert complete(tmq, "c2", 2).released == [("q", "p")]


def test_retrying_the_root_of_a_cascade_revives_the_whole_chain(tmq) -> None:
    tmq.add_flow(node("r", [node("m", [leaf("x")]), leaf("y")]))
    complete(tmq, "y", "y")
    kill(tmq, "x")
    outcome = tmq.retry("q", "r")
    assert (outcome.state, outcome.retried) == (JobState.AWAITING_CHILDREN, [("q", "x")])
    assert outcome.revived == [("q", "m"), ("q", "r")]
    for pid in ("m", "r"):
        assert_state(tmq, "q", pid, "awaiting_children")
    assert (counter(tmq, "q", "m"), counter(tmq, "q", "r")) == (1, 1)
    assert complete(tmq, "x", "x").released == [("q", "m")]
    assert complete(tmq, "m", "m").released == [("q", "r")]


def test_a_parent_dead_of_its_own_errors_goes_back_to_pending(tmq) -> None:
    tmq.add_flow(node("r", [node("m", [leaf("x")])]))
    complete(tmq, "x", "x")
    kill(tmq, "m", "own error")
    assert_state(tmq, "q", "r", "dead")
    outcome = tmq.retry("q", "m")
    assert (outcome.state, outcome.revived) == (JobState.PENDING, [("q", "r")])
    assert_state(tmq, "q", "m", "pending")
    assert tmq.children_values("q", "m") == {jref("x"): "x"}
    assert complete(tmq, "m", "m").released == [("q", "r")]


def test_a_retried_ignored_child_reattaches_and_resolves_once_more(tmq) -> None:
    # while the parent waits, a retry re-attaches the child
    # its parent ignored: out of :unsuccessful, counted again, its next end
    # (another death, or a result) resolves the parent once
    tmq.add_flow(node("p", [leaf("c1", ignore_dependency_on_failure=True), leaf("c2")]))
    kill(tmq, "c1")
    sibling = claim_one(tmq, "q", "c2")  # out of the way of the retried c1
    assert counter(tmq, "q", "p") == 1
    assert tmq.retry("q", "c1").revived == []
    assert (counter(tmq, "q", "p"), resolutions(tmq, "p")[2]) == (2, {})
    tmq.fail(claim_one(tmq, "q", "c1"), "again", dead=True)
    assert (counter(tmq, "q", "p"), resolutions(tmq, "p")[2]) == (1, {ref(tmq, "c1"): "again"})
    tmq.retry("q", "c1")
    tmq.complete(claim_one(tmq, "q", "c1"), "late")
    assert counter(tmq, "q", "p") == 1
    assert resolutions(tmq, "p")[0] == {ref(tmq, "c1"): '"late"'}  # JSON text
    assert resolutions(tmq, "p")[2] == {}
    assert_state(tmq, "q", "p", "awaiting_children")
    assert tmq.complete(sibling, 2).released == [("q", "p")]
    assert events(tmq, "q", "released") == ["p"]


@pytest.mark.parametrize(
    "flags, part",
    [({"remove_dependency_on_failure": True}, 3)],
    ids=["rd"],
)
def test_a_retried_child_never_resolves_its_parent_twice(tmq, flags, part) -> None:
    tmq.add_flow(node("p", [leaf("c1", **flags), leaf("c2")]))
    kill(tmq, "c1")
    sibling = claim_one(tmq, "q", "c2")  # out of the way of the retried c1
    assert counter(tmq, "q", "p") == 1
    for end in ("dies again", "completes"):
        assert tmq.retry("q", "c1").revived == []
        job = claim_one(tmq, "q", "c1")
        if end == "completes":
            tmq.complete(job, "late")
        else:
            tmq.fail(job, "again", dead=True)
        assert counter(tmq, "q", "p") == 1, end
        assert resolutions(tmq, "p")[part] == {ref(tmq, "c1"): "boom"}
        assert_state(tmq, "q", "p", "awaiting_children")
    assert resolutions(tmq, "p")[0] == {}  # the late result resolves nothing
    assert tmq.complete(sibling, 2).released == [("q", "p")]
    assert events(tmq, "q", "released") == ["p"]


# -- retrying a dead child its parent ignored ----------------------------------


def _ignoring_parent(mq, child_queue: str) -> None:
    mq.add_flow(
        Flow(
            "p",
            "parent",
            {},
            job_id="P",
            children=[
                Flow(child_queue, "child", {}, job_id="A", ignore_dependency_on_failure=True),
                Flow("p", "child", {}, job_id="B"),
            ],
        )
    )


def _finish(mq, queue: str, job_id: str, result=None, dead=False):
    """Claim the next job of ``queue`` (it must be ``job_id``) and finish it."""
    [job] = mq.claim(queue, 1)
    assert job.id == job_id
    return mq.fail(job, "boom", dead=True) if dead else mq.complete(job, result)


@pytest.mark.parametrize("child_queue", ["p", "c"], ids=["same-queue", "cross-queue"])
def test_retry_of_an_ignored_child_reattaches_while_the_parent_waits(mq, child_queue):
    _ignoring_parent(mq, child_queue)
    _finish(mq, child_queue, "A", dead=True)
    Pump([child_queue], mq=mq).sweep()
    ref = JobRef(child_queue, "A")
    assert mq.ignored_failures("p", "P") == {ref: "boom"}
    assert mq.dependency_counts("p", "P")["remaining"] == 1  # B still runs
    mq.retry(child_queue, "A")
    Pump([child_queue], mq=mq).sweep()
    assert mq.ignored_failures("p", "P") == {}
    assert mq.dependency_counts("p", "P")["remaining"] == 2  # A counts again
    _finish(mq, "p", "B", 2)
    assert mq.get_job("p", "P").state is JobState.AWAITING_CHILDREN  # waits for A
    _finish(mq, child_queue, "A", 1)
    Pump([child_queue], mq=mq).sweep()
    assert mq.get_job("p", "P").state is JobState.PENDING
    assert mq.children_values("p", "P") == {ref: 1, JobRef("p", "B"): 2}
    assert mq.dependency_counts("p", "P")["remaining"] == 0


def test_retry_of_an_ignored_child_is_refused_once_the_parent_went_on(mq):
    _ignoring_parent(mq, "p")
    a, b = mq.claim("p", 2)
    mq.complete(b, 2)
    mq.fail(a, "boom", dead=True)  # the parent is released without it
    assert mq.get_job("p", "P").state is JobState.PENDING
    with pytest.raises(JobNotRetryable, match="parent p/P ignored its death and is pending"):
        mq.retry("p", "A")
    assert mq.get_job("p", "A").state is JobState.DEAD  # nothing written
    assert mq.ignored_failures("p", "P") == {JobRef("p", "A"): "boom"}
