"""``enqueue_many`` on both rigs: many plain
jobs in one round trip, ids in order, rows as ``enqueue`` writes them, every
id gated and nothing written when one is refused."""

from __future__ import annotations

import pytest

from echomq_django import DuplicateJob, JobState, PayloadError
from tests.support import jobkit
from tests.support.jobkit import T0, snapshot


def test_jobs_land_in_order_as_enqueue_writes_them(tmq) -> None:
    ids = tmq.enqueue_many(
        "q",
        [
            ("a.job", {"n": 1}),
            ("a.job", [2], {"job_id": "mine", "max_attempts": 5, "backoff_ms": 10}),
            {"name": "b.job", "payload": None, "delay_ms": 300},
        ],
    )
    assert len(ids) == 3 and ids[1] == "mine"
    assert [j.id for j in tmq.claim("q", 10)] == ids[:2]
    row = jobkit.row(tmq, "q", "mine")
    assert (row["n"], row["d"], row["max_attempts"], row["backoff_ms"]) == (
        "a.job",
        "[2]",
        "5",
        "10",
    )
    jobkit.assert_state(tmq, "q", ids[2], JobState.DELAYED)
    assert jobkit.score(tmq, "q", "delayed", ids[2]) == T0 + 300
    plain = tmq.client.hgetall(tmq.keys.job("q", ids[0]))
    single = tmq.enqueue("q", "a.job", {"n": 1})
    # (enqueue's own replay token aside: enqueue_many recognises its replay by its first row)
    assert set(plain) | {b"attempts", b"lease", b"started_at", b"enqueue_token"} >= set(
        tmq.client.hgetall(tmq.keys.job("q", single))
    )
    assert jobkit.events(tmq, "q", "added") == [*ids, single]


def test_one_wake_up_and_the_earliest_run_at(tmq) -> None:
    tmq.enqueue_many("q", [("j", i, {"delay_ms": 1000 - i}) for i in range(3)] + [("j", 9)])
    wake = tmq.client.zrange(tmq.keys.queue("q").wake, 0, -1, withscores=True)
    assert wake == [(b"0", 0.0), (b"d", float(T0 + 998))]


def test_a_taken_id_refuses_the_whole_call(tmq) -> None:
    tmq.enqueue("q", "j", job_id="taken")
    before = snapshot(tmq.client)
    with pytest.raises(DuplicateJob, match="'taken'"):
        tmq.enqueue_many("q", [("j", 1), ("j", 2, {"job_id": "taken"}), ("j", 3)])
    assert snapshot(tmq.client) == before


def test_a_taken_id_in_a_later_chunk_refuses_every_chunk(redis_client, clock) -> None:
    from echomq_django import EchoMQ

    mq = EchoMQ(redis_client, prefix="emq", clock=clock, flow_chunk=2)
    mq.enqueue("q", "j", job_id="late")
    before = snapshot(mq.client)
    jobs = [("j", i, {"job_id": f"n{i}"}) for i in range(5)] + [("j", 5, {"job_id": "late"})]
    with pytest.raises(DuplicateJob):
        mq.enqueue_many("q", jobs)
    assert snapshot(mq.client) == before
    assert mq.enqueue_many("q", jobs[:5]) == [f"n{i}" for i in range(5)]
    assert [j.id for j in mq.claim("q", 10)] == ["late", *(f"n{i}" for i in range(5))]


@pytest.mark.parametrize(
    ("jobs", "error", "match"),
    [
        ([("j", 1), ("j", 2, {"job_id": "x"}), ("j", 3, {"job_id": "x"})], ValueError, "repeats"),
        ([("j", 1), ("", 2)], ValueError, "job 1 needs a name"),
        ([("j", 1, {"delay": 5})], ValueError, "unknown options"),
        ([("j", 1, {"max_attempts": 0})], ValueError, "job 0: max_attempts"),
        ([("j", 1, {"job_id": "a:b"})], ValueError, "invalid job id"),
        (["j"], ValueError, "job 0 must be"),
        ([("j", 1, 5)], ValueError, "job 0's options \\(its third item\\) must be a dict, got int"),
        ([("j", float("nan"))], PayloadError, "job 0's payload"),
    ],
)
def test_bad_input_writes_nothing(tmq, jobs, error, match) -> None:
    before = snapshot(tmq.client)
    with pytest.raises(error, match=match):
        tmq.enqueue_many("q", jobs)
    assert snapshot(tmq.client) == before


def test_a_replayed_call_writes_nothing_twice(tmq) -> None:
    k = tmq.keys.queue("q")
    # name ... gate, group, retry, expiry, callbacks
    header = '"j","","","0","0","","","1","","","",""'
    args = ["q", k.base, str(T0), "write", f'[{header},"1","r1","1"]', ""]
    keys = [k.pending, k.delayed, k.events]
    assert tmq.scripts.run("enqueue_many", keys, args) == 1
    assert tmq.scripts.run("enqueue_many", keys, args) == 0  # redis-py re-sent it
    assert tmq.client.llen(k.pending) == 1


def test_priority_and_timeout_as_enqueue_stores_them(tmq) -> None:
    ids = tmq.enqueue_many(
        "q", [("j", 1), ("j", 2, {"priority": 5, "timeout_ms": 900}), ("j", 3, {"priority": 5})]
    )
    assert [j.id for j in tmq.claim("q", 3)] == [ids[1], ids[2], ids[0]]  # higher first
    row = jobkit.row(tmq, "q", ids[1])
    assert (row["priority"], row["timeout_ms"]) == ("5", "900")
    with pytest.raises(ValueError, match="dedup_key, depends_on: use enqueue"):
        tmq.enqueue_many("q", [("j", 1, {"dedup_key": "k"})])


def test_nothing_to_add(tmq) -> None:
    assert tmq.enqueue_many("q", []) == []


# -- a job's own keep -------------------------------------------------------------


def test_a_jobs_own_keep_is_stored_and_retention_takes_it(tmq, clock) -> None:
    ids = tmq.enqueue_many(
        "q",
        [
            ("j", 1, {"job_id": "brief", "keep": 0}),
            ("j", 2, {"job_id": "plain"}),
            {"name": "j", "payload": 3, "job_id": "minute", "keep": 60},
        ],
    )
    assert ids == ["brief", "plain", "minute"]
    # the row field enqueue writes: ms, absent without a keep
    assert [jobkit.row(tmq, "q", i).get("keep") for i in ids] == ["0", None, "60000"]
    for job_id in ids:
        jobkit.complete(tmq, job_id, job_id)
    assert tmq.lifecycle.prune("q").removed == 1  # brief; its sibling without keep stays
    live = {i: tmq.client.exists(tmq.keys.job("q", i)) for i in ids}
    assert live == {"brief": 0, "plain": 1, "minute": 1}
    clock.advance(59_999)
    assert tmq.lifecycle.prune("q").removed == 0
    clock.advance(1)
    assert tmq.lifecycle.prune("q").removed == 1  # minute; plain is the queue's (1,000 / 1 day)
    live = {i: tmq.client.exists(tmq.keys.job("q", i)) for i in ids}
    assert live == {"brief": 0, "plain": 1, "minute": 0}


@pytest.mark.parametrize("keep", [-1, 1.5, True, "5"])
def test_a_bad_keep_names_its_index_and_writes_nothing(tmq, keep) -> None:
    before = snapshot(tmq.client)
    with pytest.raises(ValueError) as refused:
        tmq.enqueue_many("q", [("j", 1, {"keep": 5}), ("j", 2, {"job_id": "x", "keep": keep})])
    assert str(refused.value) == (
        "enqueue_many: job 1: keep must be a whole number of seconds >= 0 "
        f"(or None for the queue's retention), got {keep!r}"
    )
    assert snapshot(tmq.client) == before
    with pytest.raises(ValueError) as single:  # enqueue's own words, after the index
        tmq.enqueue("q", "j", 2, job_id="x", keep=keep)
    assert str(refused.value) == f"enqueue_many: job 1: {single.value}"
    assert snapshot(tmq.client) == before


# -- a job's own retry policy, expiry and callbacks (docs/howto/retries.md) ------


def test_retry_policy_expiry_and_callbacks_as_enqueue_stores_them(tmq) -> None:
    tmq.queues["q"] = {"EXPIRES_MS": 9000}
    ids = tmq.enqueue_many(
        "q",
        [
            ("j", 1),
            ("j", 2, {"backoff": "fixed", "jitter": 0.5, "retry_on": [ValueError]}),
            {"name": "j", "payload": 3, "expires_ms": 50, "delay_ms": 10},
            ("j", 4, {"on_success": "r.done", "on_dead": ("alerts", "r.dead")}),
        ],
    )
    rows = [jobkit.row(tmq, "q", i) for i in ids]
    one = tmq.enqueue("q", "j", 2, backoff="fixed", jitter=0.5, retry_on=[ValueError])
    assert rows[1]["retry_policy"] == jobkit.row(tmq, "q", one)["retry_policy"]
    assert rows[0]["expires_at"] == str(T0 + 9000)  # the queue's EXPIRES_MS
    assert rows[2]["expires_at"] == str(T0 + 10 + 50)  # after it is due
    assert rows[3]["callbacks"] == '{"d":["alerts","r.dead"],"s":"r.done"}'
    assert "callbacks" not in rows[0] and "retry_policy" not in rows[0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"jitter": 2}, "enqueue_many: job 1: bad jitter 2: jitter is a number from 0 to 1"),
        ({"backoff": "no.such.module.fn"}, "enqueue_many: job 1: .*no.such.module.fn"),
        ({"expires_ms": 0}, "enqueue_many: job 1: expires_ms must be a whole number"),
        ({"on_dead": ("q", "")}, "enqueue_many: job 1: on_dead: invalid job name"),
        ({"depends_on": ["q/x"]}, "unknown options \\['depends_on'\\]"),
    ],
)
def test_a_bad_policy_refuses_the_whole_call_before_any_write(tmq, options, match) -> None:
    before = jobkit.snapshot(tmq.client)
    with pytest.raises(ValueError, match=match):
        tmq.enqueue_many("q", [("j", 1), ("j", 2, options)])
    assert jobkit.snapshot(tmq.client) == before
