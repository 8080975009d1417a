"""Review of 49f1ea1 (retry takes a cancel back), 68809a3 (claim token reuse)
and 5fe1439 (errors in pieces): attempts to break them, on real Redis."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, JobState, RedisUnavailable
from echomq_django.runners.pump import Pump
from tests.support import jobkit
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    hash_of,
    kill,
    leaf,
    node,
    raw_row,
    ref,
)


def sweep(mq, *queues):
    Pump(list(queues), mq=mq).sweep()


def decoding_twin(client):
    """The same rig, with decode_responses=True."""
    if isinstance(client, RedisCluster):
        n = client.get_default_node()
        return RedisCluster(host=n.host, port=n.port, decode_responses=True)
    kw = client.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], decode_responses=True)


# -- errors in pieces --------------------------------------------------------

BOUNDARY_ERRORS = [pad * "a" + ch * 40 for ch in ("é", "€", "🛒") for pad in range(58, 66)] + [
    "a" * 63 + "é",
    "a" * 64 + "é",
    "€" * 22,
    "🛒" * 17,
    "x" * 65,
    "x" * 1536,
]


@pytest.mark.parametrize("error", BOUNDARY_ERRORS, ids=lambda e: f"{len(e.encode())}B")
def test_multibyte_errors_at_piece_boundaries_come_back_whole(tmq, error) -> None:
    tmq.enqueue("q", "x", {}, job_id="j")
    kill(tmq, "j", error)
    r = tmq.client.hgetall(tmq.keys.job("q", "j"))
    assert (
        all(len(v) <= 64 for f, v in r.items() if f.startswith(b"error"))
        or len(error.encode()) > 64 * 24
    )
    assert tmq.get_job("q", "j").error == error
    assert tmq.get_flow("q", "j")["error"] == error
    twin = EchoMQ(decoding_twin(tmq.client), prefix="emq", clock=tmq.clock)
    assert twin.get_job("q", "j").error == error
    assert twin.get_flow("q", "j")["error"] == error


def test_a_parent_revived_by_reattach_keeps_no_piece_of_its_error(tmq) -> None:
    long_line = "ValueError: " + "z" * 200  # the parent's 'failed by child' error is long
    tmq.add_flow(node("p", [leaf("c")]))
    kill(tmq, "c", long_line)
    assert "error.n" in raw_row(tmq, "q", "p")
    tmq.retry("q", "c")
    assert [f for f in raw_row(tmq, "q", "p") if f.startswith("error")] == []
    complete(tmq, "c", 1)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.get_job("q", "p").error is None


# -- retry takes a cancel back -----------------------------------------------


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


# -- an explorer: cancel a mixed flow, retry at every point ------------------

import itertools  # noqa: E402
import random  # noqa: E402

from echomq_django.core.exceptions import EchoMQError  # noqa: E402

KIDS = {"a": "q", "b": "q", "c": "q", "x": "o", "y": "o", "z": "o"}
RUNNING = ("b", "g", "y", "w")  # claimed before the cancel


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


# -- the worker's claim token ------------------------------------------------

from echomq_django import Worker  # noqa: E402


def lose_first_reply_on(mq, monkeypatch, lost_queue):
    """mq.claim runs for real; its first call on ``lost_queue`` raises after
    Redis ran it (the reply lost)."""
    real, calls = mq.claim, []

    def claim(queue, count=1, lease_ms=None, token=None):
        calls.append((queue, count, token))
        jobs = real(queue, count, lease_ms, token=token)
        if queue == lost_queue and sum(q == lost_queue for q, _, _ in calls) == 1:
            raise RedisUnavailable("Redis is unreachable: reply lost")  # what claim raises
        return jobs

    monkeypatch.setattr(mq, "claim", claim)
    return calls


def test_max_jobs_holds_when_one_queue_s_claim_raises(mq, monkeypatch) -> None:
    """Worker(queues=[a, b]).run(max_jobs=2): a's claim gives 1 job, b's claim
    (1 job leased) loses its reply. The replay gives b's job back; the run
    must still claim no more than 2 jobs in all."""
    mq.enqueue("a", "t.echo", "a0", job_id="a0")
    for i in range(5):
        mq.enqueue("b", "t.echo", f"b{i}", job_id=f"b{i}")
    calls = lose_first_reply_on(mq, monkeypatch, "b")
    worker = Worker(["a", "b"], concurrency=4, mq=mq)
    done = worker.run(max_jobs=2)
    completed = mq.counts("a")["completed"] + mq.counts("b")["completed"]
    assert (done, completed) == (2, 2), calls


def test_a_lost_claim_asked_again_while_paused_or_rate_limited_gets_its_jobs(mq) -> None:
    for i in range(4):
        mq.enqueue("q", "x", {}, job_id=f"j{i}")
    mq.queues["q"] = {"RATE_LIMIT": {"MAX": 2, "PER_MS": 60_000}}
    first = mq.claim("q", 3, lease_ms=60_000, token="t1")
    assert [j.id for j in first] == ["j0", "j1"]
    assert mq.claim("q", 3, token="t2").wait_ms  # the window is full
    again = mq.claim("q", 3, lease_ms=60_000, token="t1")  # full window: still its own jobs
    assert [(j.id, j.lease) for j in again] == [(j.id, j.lease) for j in first]
    mq.pause("q")
    again = mq.claim("q", 1, lease_ms=60_000, token="t1")  # paused: still its own jobs
    assert [(j.id, j.lease) for j in again] == [(j.id, j.lease) for j in first]
    assert not again.paused and not again.wait_ms
    assert mq.job_ids("q", "pending") == ["j2", "j3"]


def test_a_lost_claim_token_reused_after_its_memo_expired_claims_afresh(mq) -> None:
    import time

    for i in range(3):
        mq.enqueue("q", "x", {}, job_id=f"j{i}")
    first = mq.claim("q", 1, lease_ms=50, token="t1")
    time.sleep(0.12)
    mq.timers.recover_stalled("q")
    again = mq.claim("q", 1, lease_ms=60_000, token="t1")
    assert len(again) == 1 and again[0].lease != first[0].lease
    assert again[0].lease_deadline > mq.clock() + 50_000


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
