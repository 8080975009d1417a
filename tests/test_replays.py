"""Replays and early retries (found by adversarial testing).

redis-py re-sends a command whose reply was lost on a dropped connection, so a
script may run twice for one call. Every script must either be a no-op the
second time or recognise the replay; these tests run the same script call
twice and assert nothing moved twice. And a retry that comes before the pump
delivered the child's death takes the death back."""

from __future__ import annotations

import json

import pytest
import redis

from echomq_django import (
    DuplicateJob,
    EchoMQ,
    Flow,
    JobNotActive,
    JobRef,
    JobState,
    RedisUnavailable,
)
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, claim_one, leaf, node


def fixed_clock(mq, at=1_000_000):
    mq.clock = lambda: at
    return mq


@pytest.mark.via_flow_outbox
def test_a_replayed_trim_removes_nothing_more(mq):
    mq.add_flows(
        [
            Flow(
                "p", "parent", {}, job_id=f"P{i}", children=[Flow("c", "child", {}, job_id=f"C{i}")]
            )
            for i in range(3)
        ]
    )
    for job in mq.claim("c", 10):
        mq.complete(job, job.id)
    k = mq.keys
    outbox, lock = k.queue_key("c", "flow:outbox"), k.queue_key("c", "pump:lock")
    mq.client.set(lock, "tok")
    [first] = mq.client.lrange(outbox, 0, 0)
    assert mq.outbox.deliver([json.loads(first)])[0] == [True]
    fixed_clock(mq)  # the replay repeats the call exactly
    assert mq.outbox.trim("c", "tok", [first], ["ok"]) == 1
    assert mq.outbox.trim("c", "tok", [first], ["ok"]) == 0  # the replay: head moved on
    assert mq.client.llen(outbox) == 2
    mq.client.delete(lock)
    Pump(["c"], mq=mq).sweep()
    assert [mq.get_job("p", f"P{i}").state for i in range(3)] == [JobState.PENDING] * 3
    assert [mq.dependency_counts("p", f"P{i}")["processed"] for i in range(3)] == [1, 1, 1]


def test_a_replayed_enqueue_is_the_same_job(mq):
    # a replay is the same call (its token), not the same
    # name, payload and ms: two calls within one ms are two calls
    fixed_clock(mq)
    k = mq.keys.queue("q")
    call = (
        [k.job("e1"), k.pending, k.delayed, k.events, k.dedup("")],
        [
            "q",
            "e1",
            "x",
            '{"a":1}',
            "",
            "",
            1_000_000,
            0,
            0,
            "",
            "",
            "",
            "",
            "call-token-1",
            "",
            "",
            "",
            "",
            "",  # no group
        ],
    )
    assert mq.scripts.run("enqueue", *call) == b"pending"
    assert mq.scripts.run("enqueue", *call) == b"pending"  # redis-py re-sent it
    assert mq.job_ids("q", "pending") == ["e1"]
    with pytest.raises(DuplicateJob, match="'e1' is already used"):
        mq.enqueue("q", "x", {"a": 1}, job_id="e1")  # same data, same ms, another call
    assert mq.job_ids("q", "pending") == ["e1"]


def test_a_replayed_retry_reports_success_and_retries_once(mq):
    fixed_clock(mq)
    mq.enqueue("q", "x", {}, job_id="d1")
    [job] = mq.claim("q", 1)
    mq.fail(job, "boom", dead=True)
    k = mq.keys
    call = (
        [k.job("q", "d1"), k.queue_key("q", "dead"), k.queue_key("q", "pending")],
        ["q", k.base("q"), "d1", 1_000_000, "token-1"],
    )
    mq.scripts.run("retry", *call)
    mq.scripts.run("retry", *call)  # the replay answers as if it had worked
    assert mq.job_ids("q", "pending") == ["d1"]
    assert mq.get_job("q", "d1").state is JobState.PENDING


def test_retry_before_the_pump_delivered_the_death_takes_it_back(mq):
    mq.add_flow(
        Flow(
            "p",
            "grand",
            {},
            job_id="G",
            children=[
                Flow(
                    "p",
                    "mid",
                    {},
                    job_id="M",
                    ignore_dependency_on_failure=True,
                    children=[Flow("c", "leaf", {}, job_id="L")],
                )
            ],
        )
    )
    [leaf] = mq.claim("c", 1)
    mq.fail(leaf, "boom", dead=True)
    assert mq.counts("c")["outbox"] == 1  # the death, not delivered yet
    mq.retry("c", "L")
    assert mq.counts("c")["outbox"] == 0  # taken back: M never hears of it
    [leaf] = mq.claim("c", 1)
    mq.complete(leaf, 5)
    Pump(["c"], mq=mq).sweep()
    assert mq.get_job("p", "M").state is JobState.PENDING
    assert mq.get_job("p", "G").state is JobState.AWAITING_CHILDREN
    assert mq.ignored_failures("p", "G") == {}
    [mid] = mq.claim("p", 1)
    mq.complete(mid, {"sum": 5})
    assert mq.get_job("p", "G").state is JobState.PENDING
    assert mq.children_values("p", "G") == {JobRef("p", "M"): {"sum": 5}}


def test_pump_reports_redis_down_as_redis_unavailable():
    pump = Pump(["q"], mq=EchoMQ(redis.Redis(port=1, retry_on_error=[])))
    with pytest.raises(RedisUnavailable, match="redis://localhost:1/0"):
        pump.sweep()


def test_a_replayed_claim_returns_the_same_jobs(mq):
    fixed_clock(mq)
    for i in range(3):
        mq.enqueue("q", "x", {}, job_id=f"j{i}")
    k = mq.keys
    call = (
        [
            *(k.queue_key("q", "pending"), k.queue_key("q", "active")),
            *(k.queue_key("q", "lease:seq"), k.queue("q").claim("claim-token-1")),
        ],
        [k.base("q"), 2, 1_000_000, 5000, "claim-token-1", 0, 0, "fixed", 0, "q", 0, ""],
    )
    first = mq.scripts.run("claim", *call)
    again = json.loads(mq.scripts.run("claim", *call))  # the replay leases nothing new
    assert again == {"left": again["left"], "jobs": json.loads(first)}
    assert 0 < again["left"] <= 5000
    assert mq.job_ids("q", "pending") == ["j2"]
    assert mq.job_ids("q", "active") == ["j0", "j1"]


def test_a_claim_asked_again_with_its_token_gives_its_jobs_back(mq):
    """A caller whose claim raised (its reply lost) asks again with the same
    token: the same jobs and leases come back, with the lease they have left,
    and nothing more is leased."""
    for i in range(3):
        mq.enqueue("q", "x", {}, job_id=f"j{i}")
    first = mq.claim("q", 2, lease_ms=60_000, token="lost-1")
    again = mq.claim("q", 2, lease_ms=60_000, token="lost-1")
    assert [(j.id, j.lease, j.attempts) for j in again] == [
        (j.id, j.lease, j.attempts) for j in first
    ]
    assert [j.attempts for j in again] == [1, 1]
    # the lease left (Redis' PTTL) from the host's clock: the first deadline, to a few ms
    for a, f in zip(again, first, strict=True):
        assert f.lease_deadline - 5_000 < a.lease_deadline <= f.lease_deadline + 50
    assert mq.job_ids("q", "pending") == ["j2"]
    assert [j.id for j in mq.claim("q", 2, token="lost-2")] == ["j2"]


@pytest.mark.parametrize("token", ["", "a b", "x" * 65, "k}:"])
def test_a_bad_claim_token_is_refused_before_any_write(mq, token):
    mq.enqueue("q", "x", {}, job_id="j0")
    with pytest.raises(ValueError, match="a claim token is 1-64 of"):
        mq.claim("q", token=token)
    assert mq.job_ids("q", "pending") == ["j0"]


def test_replayed_complete_and_fail_change_nothing(mq):
    mq.add_flow(
        Flow(
            "q",
            "parent",
            {},
            job_id="P",
            children=[
                Flow("q", "child", {}, job_id="A"),
                Flow("q", "child", {}, job_id="B", max_attempts=3),
            ],
        )
    )
    a, b = sorted(mq.claim("q", 2), key=lambda j: j.id)
    assert mq.complete(a, 1).released == []
    assert mq.complete(a, 1).released == []  # same lease: a replay
    assert mq.fail(b, "boom") is JobState.DELAYED
    assert mq.fail(b, "boom") is JobState.DELAYED  # same lease: a replay
    counts = mq.dependency_counts("q", "P")
    assert (counts["processed"], counts["remaining"]) == (1, 1)
    assert mq.get_job("q", "B").attempts == 1


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


# -- a replay is recognised by the call, not by equal timestamps ---------------


def test_fail_on_a_job_this_lease_completed_is_refused(mq):
    mq.enqueue("q", "x", {}, job_id="j")
    [job] = mq.claim("q", 1)
    mq.complete(job, {"ok": 1})
    with pytest.raises(JobNotActive, match="is completed"):
        mq.fail(job, "boom")
    assert mq.get_job("q", "j").state is JobState.COMPLETED


def test_only_the_same_fail_is_a_replay(mq):
    mq.enqueue("q", "x", {}, job_id="j", max_attempts=3, backoff_ms=1000)
    [job] = mq.claim("q", 1)
    assert mq.fail(job, "boom") is JobState.DELAYED
    assert mq.fail(job, "boom") is JobState.DELAYED  # the same call again: a no-op
    with pytest.raises(JobNotActive, match="is delayed"):
        mq.fail(job, "another error")  # not a replay of that call
    assert mq.get_job("q", "j").attempts == 1


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
