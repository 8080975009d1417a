"""Retention, on both rigs: what a queue keeps of its finished jobs (a count,
an age, both), a budget per call, a job's own ``keep``, the events stream's
cap; what retention holds back (a child its dead parent may retry, a
cross-slot child until its parent goes) and what goes with a flow's root.
Every test asserts exact states, counts and keys left in Redis."""

from __future__ import annotations

import pytest

from echomq_django import FlowError, JobState
from echomq_django.core.exceptions import (
    JobNotFound,
)
from echomq_django.core.retention import Keep
from echomq_django.runners.pump import Pump
from tests.support import jobkit
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
    set_keep,
    sweep,
)


def test_retention_keeps_the_newest_count(tmq, clock) -> None:
    for i in range(5):
        tmq.enqueue("q", "n", i, job_id=f"j{i}")
    for i in range(5):
        clock.advance(1)
        complete(tmq, f"j{i}", i)
    set_keep(tmq, "q", 2)
    report = tmq.lifecycle.prune("q")
    assert (report.removed, report.held_back, report.calls) == (3, 0, 1)
    assert tmq.job_ids("q", "completed") == ["j3", "j4"]
    assert rows(tmq, "q") == ["j3", "j4"]
    with pytest.raises(JobNotFound):
        tmq.get_job("q", "j0")


def test_retention_by_age(tmq, clock) -> None:
    for i in range(3):
        tmq.enqueue("q", "n", i, job_id=f"j{i}")
        complete(tmq, f"j{i}", i)
        clock.advance(10_000)
    set_keep(tmq, "q", {"AGE_S": 15})
    # now is 30 s after j0 finished, 20 s after j1, 10 s after j2
    assert tmq.lifecycle.prune("q").removed == 2
    assert tmq.job_ids("q", "completed") == ["j2"]


def test_default_retention_is_bounded(tmq) -> None:
    completed, dead = tmq.lifecycle.retention("q")
    assert completed == Keep(1000, 86400) and dead == Keep(10000, 14 * 86400)


EVENTS_MAXLEN = 10_000  # lua/lib/emit.lua


STREAM_NODE = 100  # Redis' stream-node-max-entries: MAXLEN ~ trims whole nodes


def test_the_events_stream_keeps_at_most_its_cap(tmq) -> None:
    """The events stream is capped. 10,500 adds write 10,500
    `added` entries; the stream holds the newest 10,000 (up to one node
    more), the last one the last job's."""
    ids = tmq.enqueue_many("q", [("n", i) for i in range(EVENTS_MAXLEN + 500)])
    events = tmq.keys.queue_key("q", "events")
    length = tmq.client.xlen(events)
    assert EVENTS_MAXLEN <= length < EVENTS_MAXLEN + STREAM_NODE
    ((_, last),) = tmq.client.xrevrange(events, count=1)
    assert last == {b"e": b"added", b"id": ids[-1].encode()}


def test_every_script_writes_events_through_the_capped_writer() -> None:
    """Only lib/emit.lua names XADD on the events stream and a job's done
    stream, and wait_mark.lua on the done stream its waiter makes, each
    capped (MAXLEN ~), so no script can write an uncapped entry (the
    signals stream is trimmed by dispatch)."""
    from pathlib import Path

    lua = Path(__file__).resolve().parent.parent / "lua"
    writes = [
        (str(f.relative_to(lua)), line)
        for f in lua.rglob("*.lua")
        for line in f.read_text().splitlines()
        if "'XADD'" in line and "signals" not in line
    ]
    assert sorted({name for name, _ in writes}) == ["lib/emit.lua", "wait_mark.lua"]
    assert all("'MAXLEN', '~'" in line for _, line in writes)


def test_a_budget_bounds_each_call(tmq, clock) -> None:
    for i in range(25):
        tmq.enqueue("q", "n", i, job_id=f"j{i:02}")
        complete(tmq, f"j{i:02}", i)
    set_keep(tmq, "q", 0)
    report = tmq.lifecycle.prune("q", budget=10)
    assert (report.removed, report.calls) == (25, 3)
    assert rows(tmq, "q") == []


def test_retention_by_count_and_age_together(tmq, clock) -> None:
    """An id goes while the index holds more than COUNT or when it finished
    before the cutoff, whichever takes more (prune counts the old ones once,
    then walks the head without reading scores)."""
    for i in range(5):
        tmq.enqueue("q", "n", i, job_id=f"j{i}")
        complete(tmq, f"j{i}", i)
        clock.advance(10_000)
    # now is 50, 40, 30, 20 and 10 s after j0 ... j4 finished
    set_keep(tmq, "q", {"COUNT": 3, "AGE_S": 25})
    assert tmq.lifecycle.prune("q").removed == 3  # the age takes three: more than the count's two
    assert tmq.job_ids("q", "completed") == ["j3", "j4"]
    set_keep(tmq, "q", {"COUNT": 1, "AGE_S": 25})
    assert tmq.lifecycle.prune("q").removed == 1  # the count takes j3, younger than the cutoff
    assert tmq.job_ids("q", "completed") == ["j4"]
    assert rows(tmq, "q") == ["j4"]


def test_the_age_walk_goes_past_an_old_held_row(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="other")]))
    kill(tmq, "x", queue="other")  # held: its parent is on another slot
    for i, at in enumerate((10_000, 10_000, 20_000)):
        clock.advance(at)
        tmq.enqueue("other", "n", i, job_id=f"j{i}")
        kill(tmq, f"j{i}", queue="other")
    clock.advance(10_000)
    # now is 50 s after x died, 40 s after j0, 30 s after j1, 10 s after j2
    set_keep(tmq, "other", 1000, {"AGE_S": 25})
    report = tmq.lifecycle.prune("other")
    assert (report.removed, report.held_back) == (2, 1)
    assert tmq.job_ids("other", "dead") == ["j2", "x"]  # x re-scored to now: behind j2
    assert jobkit.score(tmq, "other", "dead", "x") == clock.now
    assert rows(tmq, "other") == ["j2", "x"]


def test_a_rows_own_keep_and_children_deadline_leave_with_its_block(tmq, clock) -> None:
    """The queue's rule takes rows a block at a time without reading their
    `keep` or children deadline: the block leaves P:{q}:expire and
    P:{q}:deadlines by id, so nothing of theirs stays."""
    tmq.enqueue("q", "n", 1, job_id="kept", keep=3600)
    complete(tmq, "kept", 1)
    tmq.add_flow(node("p", [leaf("c")], children_timeout_ms=60_000))
    kill(tmq, "c")  # p dies of it while it waits: still in P:{q}:deadlines
    zset = tmq.keys.queue_key
    assert tmq.client.zrange(zset("q", "expire"), 0, -1) == [b"kept"]
    assert tmq.client.zrange(zset("q", "deadlines"), 0, -1) == [b"p"]
    clock.advance(1)
    set_keep(tmq, "q", 0, 0)
    report = tmq.lifecycle.prune("q")
    assert (report.removed, report.held_back) == (
        3,
        1,
    )  # kept, p, c with p (held first: p may retry it)
    assert keys_of(tmq, "q") == []  # no expire, no deadlines, no row


def test_retention_leaves_a_dedup_key_its_row_freed(tmq) -> None:
    """A finished row holds no dedup key (complete and kill free it), so
    retention taking the row leaves the key to the job that holds it now."""
    tmq.enqueue("q", "n", 1, job_id="first", dedup_key="mail")
    complete(tmq, "first", 1)
    tmq.enqueue("q", "n", 3, job_id="third", dedup_key="sms")
    kill(tmq, "third")
    tmq.enqueue("q", "n", 2, job_id="second", dedup_key="mail")
    dedup = tmq.keys.queue("q").dedup
    assert (tmq.client.get(dedup("mail")), tmq.client.get(dedup("sms"))) == (b"second", None)
    set_keep(tmq, "q", 0, 0)
    assert tmq.lifecycle.prune("q").removed == 2
    assert rows(tmq, "q") == ["second"]
    assert tmq.client.get(dedup("mail")) == b"second"


# -- flows: what goes together, what is held -----------------------------------


def test_completed_children_go_once_the_parent_holds_their_values(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2"), leaf("c3")]))
    complete(tmq, "c1", 1)
    complete(tmq, "c2", 2)
    set_keep(tmq, "q", 0)
    assert tmq.lifecycle.prune("q").removed == 2
    assert rows(tmq, "q") == ["c3", "p"]
    assert tmq.children_values("q", "p") == {jref("c1"): 1, jref("c2"): 2}
    complete(tmq, "c3", 3)
    tmq.lifecycle.prune("q")
    assert_state(tmq, "q", "p", "pending")
    assert tmq.dependencies("q", "p").remaining == 0
    complete(tmq, "p", "all")
    assert tmq.lifecycle.prune("q").removed == 1
    assert keys_of(tmq, "q") == []  # the flow went as a whole: no :processed, no :children


def test_a_finished_flow_goes_as_a_whole_when_its_root_goes(tmq) -> None:
    tmq.add_flow(node("p", [node("m", [leaf("x")]), leaf("c")]))
    for job_id in ("c", "x", "m", "p"):
        complete(tmq, job_id, job_id)
    set_keep(tmq, "q", {"COUNT": 0})
    assert tmq.lifecycle.prune("q").removed == 4
    assert keys_of(tmq, "q") == []


def test_a_child_its_dead_parent_may_retry_is_held(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    kill(tmq, "c1")
    assert_state(tmq, "q", "p", "dead")
    clock.advance(1)
    set_keep(tmq, "q", 0, 1)  # dead: c1 is the oldest excess, but p may retry it
    report = tmq.lifecycle.prune("q")
    assert (report.removed, report.held_back) == (0, 1)
    assert rows(tmq, "q") == ["c1", "c2", "p"]
    tmq.retry("q", "p")  # the retry still finds c1
    assert_state(tmq, "q", "c1", "pending")


def test_a_cross_queue_fp_child_is_held_until_its_parent_goes(tmq) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="other")]))
    kill(tmq, "x", queue="other")
    set_keep(tmq, "other", 0, 0)
    report = tmq.lifecycle.prune("other")
    assert (report.removed, report.held_back) == (0, 1)
    Pump(["other"], mq=tmq).sweep()
    assert_state(tmq, "q", "p", "dead")
    set_keep(tmq, "q", 0, 0)
    assert tmq.lifecycle.prune("q").removed == 1  # p; x goes on its own slot (an rm entry)
    assert rows(tmq, "other") == [] and rows(tmq, "q") == []
    # the rm entry was delivered at once and taken out of the outbox: the pump
    # never delivers it a second time
    assert keys_of(tmq, "q") == [] and keys_of(tmq, "other") == []
    assert Pump(["q"], mq=tmq).sweep()["q"]["delivered"] == 0


def test_a_cross_queue_child_its_removed_parent_left_running_goes_when_it_dies(tmq) -> None:
    """The parent's removal reaches an active child on another slot: it is
    left to finish, and goes as it dies (fp); it used to be held for ever,
    waiting for a removal that had come already, and then to wait for
    retention (docs/explanation/lifecycle.md#a-removed-flows-running-nodes)."""
    for q in ("q", "o"):
        set_keep(tmq, q, 0, 0)
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    job = claim_one(tmq, "o", "x")
    tmq.remove("q", "p")
    assert_state(tmq, "o", "x", "active")
    assert tmq.fail_many([(job, "boom", True)])[0].state is JobState.DEAD
    assert rows(tmq, "o") == []
    report = tmq.lifecycle.prune("o")
    assert (report.removed, report.held_back) == (0, 0)


def test_a_child_under_its_parent_again_is_held_again(tmq) -> None:
    """The same flow added again while that child still runs takes it back
    (it is skipped, under the same parent id): dead fp, the new parent may
    retry it, so retention holds it again."""
    set_keep(tmq, "o", 0, 0)
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    job = claim_one(tmq, "o", "x")
    tmq.remove("q", "p")
    assert tmq.add_flow(flow).skipped == 1
    assert "orphaned" not in hash_of(tmq, tmq.keys.job("o", "x"))
    tmq.fail_many([(job, "boom", True)])
    report = tmq.lifecycle.prune("o")
    assert (report.removed, report.held_back) == (0, 1)
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "dead")
    tmq.retry("q", "p")
    assert_state(tmq, "o", "x", "pending")


def test_a_flow_retention_took_and_added_again_runs_once(tmq) -> None:
    """The same through retention: the sweep's prune removes a finished flow
    and delivers the `rm` for its child on another slot itself."""
    set_keep(tmq, "q", 0)
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    complete(tmq, "x", 1, queue="o")
    sweep(tmq, "o")
    complete(tmq, "p", "done")
    sweep(tmq, "q", "o")
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    tmq.add_flow(flow)
    for _ in range(3):
        sweep(tmq, "q", "o")
    assert_state(tmq, "o", "x", "pending")
    assert tmq.dependencies("q", "p").remaining == 1
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


# -- a job's own keep ----------------------------------------------------------


def test_a_jobs_own_keep_shortens_its_stay(tmq, clock) -> None:
    tmq.enqueue("q", "n", 1, job_id="brief", keep=0)
    tmq.enqueue("q", "n", 2, job_id="minute", keep=60)
    tmq.enqueue("q", "n", 3, job_id="plain")
    tmq.add_flow(node("p", [leaf("c", keep=30)], keep=0))
    for job_id in ("brief", "minute", "plain", "c", "p"):
        complete(tmq, job_id, job_id)
    assert tmq.lifecycle.prune("q").removed == 3  # brief, and p with its subtree (c)
    assert rows(tmq, "q") == ["minute", "plain"]
    clock.advance(60_000)
    assert tmq.lifecycle.prune("q").removed == 1
    assert rows(tmq, "q") == ["plain"]  # the queue's retention keeps it (1,000 / 1 day)


def test_a_bad_keep_is_refused_and_nothing_is_written(tmq) -> None:

    with pytest.raises(ValueError, match="keep must be a whole number of seconds >= 0"):
        tmq.enqueue("q", "n", 1, job_id="a", keep=-1)
    with pytest.raises(FlowError, match="q/p: keep must be a whole number of seconds"):
        tmq.add_flow(node("p", [leaf("c")], keep=1.5))
    assert rows(tmq, "q") == []


def test_report_held_is_the_deprecated_name_of_held_back():
    """``Report.held`` ("held" names an awaiting parent in the glossary)
    still reads for one release, with a warning that names the new field."""
    from echomq_django.protocol.lifecycle import Report

    report = Report(removed=2, held_back=1)
    with pytest.warns(
        DeprecationWarning, match=r"^Report.held is deprecated: read Report.held_back$"
    ):
        assert report.held == 1
