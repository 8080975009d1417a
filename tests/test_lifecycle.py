"""Lifecycle (DESIGN §10.2, issue 13): retention, remove and cancel, on both
rigs. Every test asserts exact states, counts and keys left in Redis."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from echomq_django import EchoMQ, JobState
from echomq_django.core.exceptions import (
    EchoMQError,
    JobCancelled,
    JobNotCancellable,
    JobNotFound,
    JobNotRemovable,
)
from echomq_django.core.retention import Keep
from echomq_django.protocol.outbox import SENT_WAIT_S
from echomq_django.runners.pump import Pump
from tests.support import jobkit
from tests.support.jobkit import assert_state, claim_one, complete, hash_of, kill, leaf, node, ref


def keys_of(mq, queue: str) -> list[str]:
    """Every key of ``queue`` but its events stream and sequence counters."""
    pattern = f"emq:{{{queue}}}:*"
    if isinstance(mq.client, RedisCluster):
        found = [
            k for n in mq.client.get_primaries() for k in mq.client.keys(pattern, target_nodes=n)
        ]
    else:
        found = mq.client.keys(pattern)
    names = sorted(k.decode() if isinstance(k, bytes) else k for k in found)
    # fixed-size markers and counters; the event kinds a queue records (issue 18);
    # the sweep lock's release mark (one element, gone within a second)
    skip = ("events", "lease:seq", "gc:seq", "wake", "signals:kinds", "pump:unlocked")
    return [n for n in names if not n.endswith(skip) and ":op:" not in n and ":claim:" not in n]


def rows(mq, queue: str) -> list[str]:
    prefix = f"emq:{{{queue}}}:job:"
    return sorted(
        k[len(prefix) :]
        for k in keys_of(mq, queue)
        if k.startswith(prefix) and ":" not in k[len(prefix) :]
    )


def set_keep(mq, queue: str, completed, dead=None) -> None:
    opts = mq.queues.setdefault(queue, {})
    opts["KEEP_COMPLETED"] = completed
    if dead is not None:
        opts["KEEP_DEAD"] = dead


# -- retention ---------------------------------------------------------------


def test_retention_keeps_the_newest_count(tmq, clock) -> None:
    for i in range(5):
        tmq.enqueue("q", "n", i, job_id=f"j{i}")
    for i in range(5):
        clock.advance(1)
        complete(tmq, f"j{i}", i)
    set_keep(tmq, "q", 2)
    report = tmq.lifecycle.prune("q")
    assert (report.removed, report.held, report.calls) == (3, 0, 1)
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
    """DESIGN §3: the events stream is capped. 10,500 adds write 10,500
    `added` entries; the stream holds the newest 10,000 (up to one node
    more), the last one the last job's."""
    ids = tmq.enqueue_many("q", [("n", i) for i in range(EVENTS_MAXLEN + 500)])
    events = tmq.keys.queue_key("q", "events")
    length = tmq.client.xlen(events)
    assert EVENTS_MAXLEN <= length < EVENTS_MAXLEN + STREAM_NODE
    ((_, last),) = tmq.client.xrevrange(events, count=1)
    assert last == {b"e": b"added", b"id": ids[-1].encode()}


def test_every_script_writes_events_through_the_capped_writer() -> None:
    """Only lib/emit.lua names XADD on the events stream, so no script can
    write an uncapped entry (the signals stream is trimmed by dispatch)."""
    from pathlib import Path

    lua = Path(__file__).resolve().parent.parent / "lua"
    writers = sorted(
        str(f.relative_to(lua))
        for f in lua.rglob("*.lua")
        for line in f.read_text().splitlines()
        if "'XADD'" in line and "signals" not in line
    )
    assert writers == ["lib/emit.lua"]


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
    assert (report.removed, report.held) == (2, 1)
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
    assert (report.removed, report.held) == (3, 1)  # kept, p, c with p (held first: p may retry it)
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


def test_completed_children_go_once_the_parent_holds_their_values(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1"), leaf("c2"), leaf("c3")]))
    complete(tmq, "c1", 1)
    complete(tmq, "c2", 2)
    set_keep(tmq, "q", 0)
    assert tmq.lifecycle.prune("q").removed == 2
    assert rows(tmq, "q") == ["c3", "p"]
    assert tmq.children_values("q", "p") == {ref(tmq, "c1"): 1, ref(tmq, "c2"): 2}
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
    assert (report.removed, report.held) == (0, 1)
    assert rows(tmq, "q") == ["c1", "c2", "p"]
    tmq.retry("q", "p")  # the retry still finds c1
    assert_state(tmq, "q", "c1", "pending")


def test_a_cross_queue_fp_child_is_held_until_its_parent_goes(tmq) -> None:
    tmq.add_flow(node("p", [leaf("x", queue="other")]))
    kill(tmq, "x", queue="other")
    set_keep(tmq, "other", 0, 0)
    report = tmq.lifecycle.prune("other")
    assert (report.removed, report.held) == (0, 1)
    Pump(["other"], mq=tmq).sweep()
    assert_state(tmq, "q", "p", "dead")
    set_keep(tmq, "q", 0, 0)
    assert tmq.lifecycle.prune("q").removed == 1  # p; x goes on its own slot (an rm entry)
    assert rows(tmq, "other") == [] and rows(tmq, "q") == []
    # the rm entry was delivered at once and taken out of the outbox: the pump
    # never delivers it a second time
    assert keys_of(tmq, "q") == [] and keys_of(tmq, "other") == []
    assert Pump(["q"], mq=tmq).sweep()["q"]["delivered"] == 0


# -- entries a call delivered itself are not delivered again ------------------


def sweep(mq, *queues: str) -> None:
    Pump(list(queues), mq=mq).sweep()


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
    assert tmq.children_values("q", "p") == {ref(tmq, "c1"): 1, ref(tmq, "x", "o"): 2}


def test_remove_waits_out_a_sweeping_pump_then_delivers_its_entries_once(tmq) -> None:
    """A pump holds q's outbox (its sweep's lease, 300 ms here): remove waits
    for it instead of leaving its `rm` to a sweep that may have read the
    outbox already, then delivers it and takes it out."""
    flow = node("p", [leaf("x", queue="o")])
    tmq.add_flow(flow)
    assert tmq.outbox.lock("q", "a-sweeping-pump", 300)
    tmq.remove("q", "p")
    assert rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue_key("q", "flow:outbox")) == 0
    tmq.add_flow(flow)
    sweep(tmq, "q", "o")
    assert_state(tmq, "o", "x", "pending")


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
        ref(tmq, "c1"): "cancelled",
        ref(tmq, "x", "o"): "cancelled",
    }
    tmq.retry("q", "p")
    assert_state(tmq, "o", "x", "pending")
    sweep(tmq, "q", "o")
    assert_state(tmq, "q", "p", "awaiting_children")
    complete(tmq, "c1", 1)
    complete(tmq, "x", 2, queue="o")
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "pending")


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
    assert tmq.children_values("q", "p") == {ref(tmq, "c"): 7}


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
    cancelled = [i for i in range(1, 5) if jobkit.row(tmq, "q", f"c{i}")["state"] == "dead"]
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


def test_a_retried_child_takes_its_death_back_past_a_poison_entry(tmq) -> None:
    """x on `o` died (fp) and its death waits in o's outbox behind a poison
    entry (not JSON): the retry of x reads past it (it used to raise a
    cjson error), takes its death back and p, which never saw it, waits."""
    tmq.add_flow(node("p", [leaf("x", queue="o", max_attempts=1)]))
    outbox = tmq.keys.queue_key("o", "flow:outbox")
    tmq.client.rpush(outbox, "not json, naming " + tmq.keys.job("o", "x"))
    job = claim_one(tmq, "o", "x")
    assert tmq.fail_many([(job, "boom", True)])[0].state is JobState.DEAD
    assert tmq.client.llen(outbox) == 2
    assert tmq.retry("o", "x").state is JobState.PENDING
    assert tmq.client.lrange(outbox, 0, -1) == [
        b"not json, naming " + tmq.keys.job("o", "x").encode()
    ]
    assert_state(tmq, "q", "p", "awaiting_children")


def test_a_cross_queue_child_its_removed_parent_left_running_goes_when_it_dies(tmq) -> None:
    """The parent's removal reaches an active child on another slot: it is
    left to finish, and once it died (fp) retention takes it; it used to be
    held for ever, waiting for a removal that had come already."""
    for q in ("q", "o"):
        set_keep(tmq, q, 0, 0)
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    job = claim_one(tmq, "o", "x")
    tmq.remove("q", "p")
    assert_state(tmq, "o", "x", "active")
    assert tmq.fail_many([(job, "boom", True)])[0].state is JobState.DEAD
    report = tmq.lifecycle.prune("o")
    assert (report.removed, report.held) == (1, 0)
    assert rows(tmq, "o") == []


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
    assert (report.removed, report.held) == (0, 1)
    sweep(tmq, "o")
    assert_state(tmq, "q", "p", "dead")
    tmq.retry("q", "p")
    assert_state(tmq, "o", "x", "pending")


def test_undeliverable_entries_never_hold_up_the_ones_behind_them(tmq) -> None:
    """600 completions of a flow removed before its children's pump ran
    (more than a sweep's batch of 500) sit ahead of a live flow's entry: the
    live parent is released by the first sweep; the 600 go to the
    dead-letter list after max_tries sweeps, each delivered once a sweep."""
    from echomq_django import Flow

    tmq.add_flow(Flow("q", "n", None, job_id="big", children=[
        Flow("o", "n", None, job_id=f"c{i}") for i in range(600)]))  # fmt: skip
    for _ in range(6):
        tmq.complete_many([(j, 1) for j in tmq.claim("o", 100)])
    tmq.client.delete(tmq.keys.job("q", "big"))  # gone before o's pump ran
    tmq.add_flow(node("live", [leaf("y", queue="o")]))
    complete(tmq, "y", "ok", queue="o")
    pump = Pump(["o"], mq=tmq, max_tries=3)
    first = pump.sweep()["o"]
    assert (first["delivered"], first["deadlettered"]) == (1, 0)
    assert_state(tmq, "q", "live", "pending")
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 600
    assert [pump.sweep()["o"]["deadlettered"] for _ in range(2)] == [0, 600]
    assert tmq.client.llen(tmq.keys.queue_key("o", "flow:outbox")) == 0
    assert tmq.client.exists(tmq.keys.queue_key("o", "flow:tries")) == 0


# -- incarnations: an entry meant for a removed flow never reaches its successor


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
    assert tmq.children_values("q", "p") == {ref(tmq, "x", "o"): "new"}


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
    assert tmq.children_values("q", "p") == {ref(tmq, "c3"): 3}


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
    assert tmq.children_values("q", "p") == {ref(tmq, "n1"): 1}


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


def sweep_report(mq, queue: str) -> dict:
    return Pump([queue], mq=mq).sweep()[queue]


# -- waiting for a sweeping pump blocks on Redis (DESIGN §6, §10.1) -----------


def count_takes(mq, queue: str) -> list[bool]:
    """Record, from now on, what each take of ``queue``'s sweep lock by
    ``mq`` answered (its drops are not counted)."""
    takes: list[bool] = []
    original = mq.outbox.lock

    def counted(q, token, lease_ms, take=True):
        held = original(q, token, lease_ms, take)
        if take and q == queue:
            takes.append(held)
        return held

    mq.outbox.lock = counted
    return takes


def command_calls(mq, queue: str, command: str) -> int:
    """How many times the master of ``queue``'s slot has run ``command``
    (INFO commandstats)."""
    client, target = mq.client, {}
    if isinstance(client, RedisCluster):
        target = {"target_nodes": client.get_node_from_key(mq.keys.queue(queue).pump_lock)}
    stats = client.info("commandstats", **target)
    return stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0)


def drop_later(holder, token: str, after_s: float) -> tuple[threading.Thread, list[bool]]:
    """A thread that drops ``holder``'s sweep lock on q after ``after_s``."""
    dropped: list[bool] = []

    def run() -> None:
        time.sleep(after_s)
        dropped.append(holder.outbox.lock("q", token, 10_000, take=False))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, dropped


def test_remove_blocked_on_a_held_sweep_lock_goes_on_when_the_holder_drops_it(tmq) -> None:
    """The pump's lease (10 s) outlasts SENT_WAIT_S, so only its drop lets
    remove deliver its `rm` entry. remove blocks on the lock's released list
    and wakes at the drop: two takes of the lock (refused, then held), where
    the old loop took it every 5 ms (some 40 times in the 200 ms)."""
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    pump = EchoMQ(tmq.client, prefix="emq")
    assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
    takes, blpops = count_takes(tmq, "q"), command_calls(tmq, "q", "blpop")
    thread, dropped = drop_later(pump, "a-sweeping-pump", 0.2)
    began = time.monotonic()
    tmq.remove("q", "p")
    took = time.monotonic() - began
    thread.join(10)
    assert dropped == [True]
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []  # the rm entry reached x
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert takes[0] is False and takes[-1] is True and len(takes) <= 4, takes
    assert 1 <= command_calls(tmq, "q", "blpop") - blpops <= 3
    assert took < SENT_WAIT_S  # it did not wait for the give-up


def test_a_sweep_lock_whose_holder_died_is_taken_when_its_lease_ends(tmq) -> None:
    """A dead pump drops nothing: the wait ends at the lock's expiry (its
    PTTL bounds the BLPOP), and remove delivers then, not after SENT_WAIT_S
    (when it would give up and leave the entry in the outbox)."""
    tmq.add_flow(node("p", [leaf("x", queue="o")]))
    assert EchoMQ(tmq.client, prefix="emq").outbox.lock("q", "a-dead-pump", 800)
    takes = count_takes(tmq, "q")
    began = time.monotonic()
    tmq.remove("q", "p")
    took = time.monotonic() - began
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert takes[0] is False and takes[-1] is True and len(takes) <= 4, takes
    assert 0.5 <= took < SENT_WAIT_S  # after the lease, before the give-up


def test_each_drop_of_the_sweep_lock_wakes_the_next_waiter(tmq) -> None:
    """Two removes wait on one held lock: the pump's drop wakes one, whose
    own drop, after it delivered, wakes the other. Both entries are
    delivered and the outbox is empty; no remove waited for the give-up."""
    for i in (1, 2):
        tmq.add_flow(node(f"p{i}", [leaf(f"x{i}", queue="o")]))
    pump = EchoMQ(tmq.client, prefix="emq")
    assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
    errors: list[BaseException] = []

    def remove(job_id: str) -> None:
        try:
            EchoMQ(tmq.client, prefix="emq").remove("q", job_id)
        except BaseException as err:  # reported by the assert below
            errors.append(err)

    removers = [threading.Thread(target=remove, args=(f"p{i}",), daemon=True) for i in (1, 2)]
    began = time.monotonic()
    for t in removers:
        t.start()
    thread, dropped = drop_later(pump, "a-sweeping-pump", 0.3)
    for t in [*removers, thread]:
        t.join(10)
    took = time.monotonic() - began
    assert errors == [] and dropped == [True]
    assert rows(tmq, "q") == [] and rows(tmq, "o") == []
    assert tmq.client.llen(tmq.keys.queue("q").outbox) == 0
    assert took < SENT_WAIT_S


def test_the_wait_stays_under_a_short_socket_timeout(tmq) -> None:
    """A client whose reads time out after 0.5 s, and are not re-sent: each
    BLPOP ends before that (a cut one raised RedisUnavailable), and the
    remove still goes on at the drop, a second later."""
    client, once = tmq.client, {"socket_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}
    if isinstance(client, RedisCluster):
        node0 = client.get_default_node()
        short = RedisCluster(host=node0.host, port=node0.port, **once)
    else:
        kw = client.connection_pool.connection_kwargs
        short = redis.Redis(host=kw["host"], port=kw["port"], **once)
    try:
        mq = EchoMQ(short, prefix="emq")
        mq.add_flow(node("p", [leaf("x", queue="o")]))
        pump = EchoMQ(client, prefix="emq")
        assert pump.outbox.lock("q", "a-sweeping-pump", 10_000)
        thread, dropped = drop_later(pump, "a-sweeping-pump", 1.0)
        mq.remove("q", "p")
        thread.join(10)
        assert dropped == [True]
        assert rows(tmq, "q") == [] and rows(tmq, "o") == []
        assert client.llen(tmq.keys.queue("q").outbox) == 0
    finally:
        short.close()


def test_the_released_list_holds_one_mark_that_expires(tmq) -> None:
    """Each drop leaves one mark, never more, with a TTL of at most 1 s; a
    drop of a lock that is not the caller's leaves none."""
    unlocked = tmq.keys.queue("q").pump_unlocked
    for i in range(100):
        assert tmq.outbox.lock("q", f"pump-{i}", 2_000)
        assert tmq.outbox.lock("q", f"pump-{i}", 2_000, take=False)
    assert tmq.client.lrange(unlocked, 0, -1) == [b"1"]
    assert 0 < tmq.client.pttl(unlocked) <= 1_000
    tmq.client.delete(unlocked)
    assert tmq.outbox.lock("q", "the-holder", 2_000)
    assert not tmq.outbox.lock("q", "not-the-holder", 2_000, take=False)
    assert tmq.client.exists(unlocked) == 0
    assert tmq.outbox.lock("q", "the-holder", 2_000, take=False)


# -- remove ------------------------------------------------------------------


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
    assert deps.removed == {ref(tmq, "c2"): "removed"} and deps.remaining == 0


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


# -- cancel ------------------------------------------------------------------


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


# -- ids after removal -------------------------------------------------------


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
    assert tmq.children_values("q", "p") == {ref(tmq, "c1"): 1, ref(tmq, "c2", "other"): 2}


def test_attaching_a_completed_parentless_job_counts_it_at_once(tmq) -> None:
    tmq.enqueue("q", "leaf", {}, job_id="a")
    complete(tmq, "a", 7)
    tmq.enqueue("other", "leaf", {}, job_id="x")
    complete(tmq, "x", 8, queue="other")
    landed = tmq.add_flow(node("p", [leaf("a"), leaf("x", queue="other"), leaf("b")]))
    assert (landed.landed, landed.skipped) == (2, 2)
    assert tmq.children_values("q", "p") == {ref(tmq, "a"): 7}
    Pump(["other"], mq=tmq).sweep()  # x's stored result reaches p through the outbox
    assert tmq.children_values("q", "p") == {ref(tmq, "a"): 7, ref(tmq, "x", "other"): 8}
    assert tmq.get_job("q", "a").parent == "p" and tmq.get_job("other", "x").parent_queue == "q"
    complete(tmq, "b", 9)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.dependencies("q", "p").remaining == 0


def test_attaching_a_job_with_another_live_parent_is_a_conflict(tmq) -> None:
    from echomq_django.core.exceptions import FlowConflict

    tmq.add_flow(node("p", [leaf("a")]))
    complete(tmq, "a", 1)
    with pytest.raises(FlowConflict, match="q a exists as job leaf under parent q/p"):
        tmq.add_flow(node("p2", [leaf("a")]))
    assert rows(tmq, "q") == ["a", "p"]


def test_a_new_root_over_children_that_finished_never_waits(tmq) -> None:
    flow = node("p", [leaf("c1"), leaf("c2")])
    tmq.add_flow(flow)
    running = claim_one(tmq, "q", "c1")
    tmq.remove("q", "p")  # c1 is active: left to finish, an orphan
    assert rows(tmq, "q") == ["c1"]
    tmq.complete(running, 1)  # its fan-in finds no parent: nothing moves
    tmq.add_flow(flow)  # c1 is skipped, and tells the new p its stored result
    assert tmq.children_values("q", "p") == {ref(tmq, "c1"): 1}
    complete(tmq, "c2", 2)
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
    from echomq_django import FlowError

    with pytest.raises(ValueError, match="keep must be a whole number of seconds >= 0"):
        tmq.enqueue("q", "n", 1, job_id="a", keep=-1)
    with pytest.raises(FlowError, match="q/p: keep must be a whole number of seconds"):
        tmq.add_flow(node("p", [leaf("c")], keep=1.5))
    assert rows(tmq, "q") == []


# -- a retry takes a cancel back -----------------------------------------------


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
    assert tmq.children_values("q", "p") == {ref(tmq, "b"): 2}


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
