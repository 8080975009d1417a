"""The single-job protocol on both rigs: enqueue, claim, complete, fail,
retry, leases and their recovery, each one atomic script.

Every transition is followed by the exact row and exactly one state index
holding the id (``assert_state``). Time is the ``clock`` fixture (T0 ms).
"""

from __future__ import annotations

import socket

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq_django
from echomq_django import (
    DuplicateJob,
    EchoMQ,
    Job,
    JobCancelled,
    JobNotActive,
    JobNotFound,
    JobNotRetryable,
    JobState,
    LeaseLost,
    PayloadError,
    RedisUnavailable,
)
from echomq_django.conf import reset
from tests.support.jobkit import T0, assert_state, claim_one, row, score, snapshot


def test_enqueue_writes_the_row_and_pending(tmq) -> None:
    assert (
        tmq.enqueue(
            "q",
            "mail.send",
            {"to": "a@b", "n": [1, 2]},
            job_id="j1",
            max_attempts=5,
            backoff_ms=250,
        )
        == "j1"
    )
    # compact row: attempts appears at the first claim; the call's token is
    # kept for its replay
    found = assert_state(tmq, "q", "j1", "pending")
    assert len(found.pop("enqueue_token")) == 16
    assert found == {
        "n": "mail.send",
        "d": '{"to":"a@b","n":[1,2]}',
        "s": "pending",
        "max_attempts": "5",
        "backoff_ms": "250",
        "ca": str(T0),
    }
    job = tmq.get_job("q", "j1")
    assert (
        job.id,
        job.queue,
        job.name,
        job.payload,
        job.state,
        job.attempts,
        job.max_attempts,
        job.backoff_ms,
        job.created_at,
        job.parent,
        job.lease,
    ) == (
        "j1",
        "q",
        "mail.send",
        {"to": "a@b", "n": [1, 2]},
        JobState.PENDING,
        0,
        5,
        250,
        T0,
        None,
        None,
    )
    events = tmq.client.xrange(tmq.keys.queue_key("q", "events"))
    assert [e[1] for e in events] == [{b"e": b"added", b"id": b"j1"}]


def test_enqueue_defaults_and_generated_id(redis_client, clock) -> None:
    mq = EchoMQ(redis_client, queues={"slow": {"MAX_ATTEMPTS": 7, "BACKOFF_MS": 5}}, clock=clock)
    job_id = mq.enqueue("slow", "n")
    assert len(job_id) == 16 and job_id != mq.enqueue("slow", "n")
    # a job without its own settings stores none: the queue's apply (compact rows)
    found = row(mq, "slow", job_id)
    assert len(found.pop("enqueue_token")) == 16
    assert found == {
        "n": "n",
        "d": "null",
        "s": "pending",
        "ca": str(T0),
    }
    job = mq.get_job("slow", job_id)
    assert (job.max_attempts, job.backoff_ms, job.attempts) == (7, 5, 0)
    other = mq.get_job("other", mq.enqueue("other", "n", job_id="d"))
    assert (other.max_attempts, other.backoff_ms) == (3, 1000)


def test_enqueue_with_delay_is_delayed_until_run_at(tmq) -> None:
    assert tmq.enqueue("q", "n", 1, job_id="later", delay_ms=1500) == "later"
    assert assert_state(tmq, "q", "later", "delayed")["s"] == "delayed"
    assert score(tmq, "q", "delayed", "later") == T0 + 1500
    assert tmq.claim("q") == []


@pytest.mark.parametrize("state", ["pending", "active", "dead"])
def test_duplicate_id_is_refused_and_nothing_changes(tmq, state) -> None:
    tmq.enqueue("q", "n", {"first": True}, job_id="j1")
    if state != "pending":
        job = claim_one(tmq, "q", "j1")
        if state == "dead":
            tmq.fail(job, "x", dead=True)
    before = snapshot(tmq.client)
    with pytest.raises(DuplicateJob) as exc:
        tmq.enqueue("q", "other", {"second": True}, job_id="j1", delay_ms=10)
    assert str(exc.value) == (
        f"job id 'j1' is already used in queue 'q' (state {state}); ids are unique per queue"
    )
    assert snapshot(tmq.client) == before


@pytest.mark.parametrize(
    "payload, message",
    [
        (object(), "payload is not JSON-serialisable: Object of type object"),
        ({1, 2}, "payload is not JSON-serialisable: Object of type set"),
        (float("nan"), "payload is not JSON-serialisable: Out of range float values"),
        (
            "x" * 200,
            "payload is 202 bytes of JSON; the limit is 200 bytes "
            "(ECHOMQ MAX_PAYLOAD_BYTES; EchoMQ's max_payload_bytes)",
        ),
    ],
    ids=["object", "set", "nan", "oversized"],
)
def test_bad_payload_is_refused_and_nothing_written(redis_client, payload, message) -> None:
    """Refused before the first write: nor is its queue (a fresh one here)
    noted among the known queues (it was, and the stats listed a queue that
    never held a job)."""
    mq = EchoMQ(redis_client, max_payload_bytes=200)
    mq.enqueue("q", "n", "x" * 198, job_id="fits")  # exactly 200 bytes of JSON
    before = snapshot(redis_client)
    for queue in ("q", "fresh"):
        with pytest.raises(PayloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
            mq.enqueue(queue, "n", payload, job_id="j1")
    assert snapshot(redis_client) == before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": ""}, "invalid job name ''"),
        ({"max_attempts": 0}, "max_attempts must be a whole number >= 1, got 0"),
        ({"max_attempts": "x"}, "max_attempts must be a whole number >= 1, got 'x'"),
        ({"max_attempts": 1.5}, "max_attempts must be a whole number >= 1, got 1.5"),
        ({"delay_ms": -1}, r"delay_ms must be a whole number >= 0 \(ms\), got -1"),
        ({"delay_ms": None}, r"delay_ms must be a whole number >= 0 \(ms\), got None"),
        ({"backoff_ms": True}, r"backoff_ms must be a whole number >= 0 \(ms\), got True"),
    ],
    ids=[
        "no-name",
        "max-attempts-0",
        "max-attempts-str",
        "max-attempts-float",
        "negative-delay",
        "delay-none",
        "backoff-bool",
    ],
)
def test_bad_enqueue_arguments(mq, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        mq.enqueue("q", **{"name": "n", **kwargs})
    assert snapshot(mq.client) == {}


def test_claim_takes_k_fifo_with_fresh_leases(tmq) -> None:
    for i in range(5):
        tmq.enqueue("q", "n", {"i": i}, job_id=f"j{i}", max_attempts=4, backoff_ms=9)
    jobs = tmq.claim("q", 3, lease_ms=500)
    assert [j.id for j in jobs] == ["j0", "j1", "j2"]
    assert [j.payload for j in jobs] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert {
        (j.state, j.attempts, j.max_attempts, j.backoff_ms, j.lease_deadline, j.created_at)
        for j in jobs
    } == {(JobState.ACTIVE, 1, 4, 9, T0 + 500, T0)}
    more = tmq.claim("q", 10, lease_ms=500)
    assert [j.id for j in more] == ["j3", "j4"]
    tokens = [j.lease for j in jobs + more]
    assert len(set(tokens)) == 5 and all(tokens)
    for j in jobs + more:
        r = assert_state(tmq, "q", j.id, "active")
        assert (r["lease"], r["attempts"], r["started_at"]) == (j.lease, "1", str(T0))
        assert score(tmq, "q", "active", j.id) == T0 + 500
        assert tmq.get_job("q", j.id).lease_deadline == T0 + 500
    assert tmq.claim("q", 4) == []
    with pytest.raises(ValueError, match="count must be a whole number >= 1, got 0"):
        tmq.claim("q", 0)
    rule = r"lease_ms must be a whole number from 1 to 31,536,000,000 \(ms\), got "
    with pytest.raises(ValueError, match=rule + "-5"):
        tmq.claim("q", 1, lease_ms=-5)
    with pytest.raises(ValueError, match=rule + "31536000001"):  # 365 days at most
        tmq.claim("q", 1, lease_ms=365 * 86_400_000 + 1)


def test_claim_uses_the_queue_lease_by_default(redis_client, clock) -> None:
    mq = EchoMQ(redis_client, queues={"q": {"LEASE_MS": 777}}, clock=clock)
    mq.enqueue("q", "n", job_id="a")
    assert claim_one(mq, "q").lease_deadline == T0 + 777


def test_complete_stores_the_result(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="j1")
    job = claim_one(tmq, "q", "j1")
    clock.advance(40)
    outcome = tmq.complete(job, {"ok": [1, "two"]})
    assert (outcome.state, outcome.released, outcome.outbox) == (JobState.COMPLETED, [], 0)
    r = assert_state(tmq, "q", "j1", "completed")
    # the row keeps its last lease token: a replayed complete recognises itself
    assert (r["result"], r["finished_at"], r["lease"]) == (
        '{"ok":[1,"two"]}',
        str(T0 + 40),
        job.lease,
    )
    assert score(tmq, "q", "completed", "j1") == T0 + 40
    assert tmq.get_job("q", "j1").result == {"ok": [1, "two"]}


def test_complete_refusals(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="p")
    with pytest.raises(JobNotActive, match="^job 'p' in queue 'q' is pending$"):
        tmq.complete(tmq.get_job("q", "p"))
    job = claim_one(tmq, "q", "p", lease_ms=100)
    with pytest.raises(PayloadError, match="result is not JSON-serialisable"):
        tmq.complete(job, object())
    assert_state(tmq, "q", "p", "active")
    clock.advance(101)
    assert tmq.timers.recover_stalled("q", max_stalls=5).recovered == 1
    fresh = claim_one(tmq, "q", "p")
    with pytest.raises(LeaseLost, match="job 'p' in queue 'q': lease token is stale"):
        tmq.complete(job, "late")
    assert assert_state(tmq, "q", "p", "active")["lease"] == fresh.lease
    tmq.complete(fresh, "won")
    # the same lease and result again is a replay of that completion: nothing changes
    assert tmq.complete(fresh, "won").released == []
    with pytest.raises(JobNotActive, match="is completed"):
        tmq.complete(fresh, "again")  # same lease, another result: not a replay
    with pytest.raises(JobNotActive, match="is completed"):
        tmq.complete(job, "stale lease, finished job")
    ghost = Job(id="nope", queue="q", name="n", lease="1.1", _mq=tmq)
    with pytest.raises(JobNotFound, match="^job 'nope' not found in queue 'q'$"):
        tmq.complete(ghost)
    assert assert_state(tmq, "q", "p", "completed")["result"] == '"won"'


def test_fail_backs_off_exponentially_with_a_cap_then_dies(redis_client, clock) -> None:
    mq = EchoMQ(redis_client, clock=clock, backoff_cap_ms=3000)
    mq.enqueue("q", "n", job_id="j", max_attempts=4, backoff_ms=1000)
    for attempt, wait in ((1, 1000), (2, 2000), (3, 3000)):  # 1000*2**(n-1), capped at 3000
        job = claim_one(mq, "q", "j")
        assert job.attempts == attempt
        assert mq.fail(job, f"err {attempt}") is JobState.DELAYED
        r = assert_state(mq, "q", "j", "delayed")
        assert (r["error"], r["attempts"], r["lease"]) == (
            f"err {attempt}",
            str(attempt),
            job.lease,
        )
        assert score(mq, "q", "delayed", "j") == clock.now + wait
        clock.advance(wait - 1)
        assert mq.timers.promote_delayed("q") == 0
        clock.advance(1)
        assert mq.timers.promote_delayed("q") == 1
        assert_state(mq, "q", "j", "pending")
    outcome = mq.fail_many([(claim_one(mq, "q", "j"), "err 4")])[0]
    assert (outcome.state, outcome.dead, outcome.run_at) == (JobState.DEAD, [("q", "j")], None)
    r = assert_state(mq, "q", "j", "dead")
    assert (r["error"], r["finished_at"], r["attempts"]) == ("err 4", str(clock.now), "4")
    assert score(mq, "q", "dead", "j") == clock.now


def test_fail_with_no_backoff_is_pending_and_dead_true_forces_dead(tmq) -> None:
    tmq.enqueue("q", "n", job_id="a", max_attempts=3, backoff_ms=0)
    tmq.enqueue("q", "n", job_id="b", max_attempts=3, backoff_ms=1000)
    assert tmq.fail(claim_one(tmq, "q", "a"), "retry now") is JobState.PENDING
    assert assert_state(tmq, "q", "a", "pending")["error"] == "retry now"
    assert tmq.fail(claim_one(tmq, "q", "b"), "fatal", dead=True) is JobState.DEAD
    assert assert_state(tmq, "q", "b", "dead")["attempts"] == "1"


def test_fail_refusals(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="j")
    with pytest.raises(JobNotActive, match="^job 'j' in queue 'q' is pending$"):
        tmq.fail(tmq.get_job("q", "j"), "x")
    stale = claim_one(tmq, "q", "j", lease_ms=10)
    clock.advance(11)
    tmq.timers.recover_stalled("q", max_stalls=3)
    claim_one(tmq, "q", "j")
    with pytest.raises(LeaseLost, match="lease token is stale"):
        tmq.fail(stale, "x")
    with pytest.raises(JobNotFound, match="job 'zz' not found in queue 'q'"):
        tmq.fail(Job(id="zz", queue="q", name="n", lease="1.1", _mq=tmq), "x")
    assert assert_state(tmq, "q", "j", "active")["attempts"] == "2"


def test_extend_lease(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="j")
    job = claim_one(tmq, "q", "j", lease_ms=100)
    clock.advance(90)
    assert tmq.extend_lease(job, 1000) == T0 + 1090 == job.lease_deadline
    assert score(tmq, "q", "active", "j") == T0 + 1090
    clock.advance(500)
    assert tmq.timers.recover_stalled("q").recovered == 0
    assert_state(tmq, "q", "j", "active")
    stale = Job(id="j", queue="q", name="n", lease="0.0", _mq=tmq)
    with pytest.raises(LeaseLost):
        tmq.extend_lease(stale, 10)
    tmq.complete(job)
    with pytest.raises(JobNotActive, match="is completed"):
        tmq.extend_lease(job, 10)
    assert score(tmq, "q", "active", "j") is None


def test_extend_leases_checks_each_job_alone_in_one_round_trip(tmq, clock, monkeypatch) -> None:
    """The heartbeat's call: each job of any queue extended or refused on its own, refused ones
    untouched, one pipeline for all (each queue's jobs in calls of COMPLETE_BATCH)."""
    for job_id in ("a", "b", "c", "d", "e"):
        tmq.enqueue("q", "n", job_id=job_id)
    tmq.enqueue("r", "n", job_id="f")
    tmq.enqueue("r", "n", job_id="g")
    held = {job.id: job for job in [*tmq.claim("q", 5, 100), *tmq.claim("r", 2, 100)]}
    tmq.complete(held["b"])
    tmq.cancel("r", "g")
    stale = Job(id="f", queue="r", name="n", lease="0.0", _mq=tmq)
    missing = Job(id="zz", queue="q", name="n", lease="1.1", _mq=tmq)
    jobs = [held["a"], held["b"], missing, stale, held["g"], held["c"], held["d"], held["e"]]
    rounds = []
    run_many = tmq.scripts.run_many
    monkeypatch.setattr(
        tmq.scripts, "run_many", lambda calls: rounds.append(calls) or run_many(calls)
    )
    monkeypatch.setattr("echomq_django.protocol.client.COMPLETE_BATCH", 2)
    clock.advance(90)
    out = tmq.extend_leases(jobs, {"q": 1000, "r": 2000})
    assert [len(calls) for calls in rounds] == [4]  # q: 6 jobs in 3 calls, r: 2 in 1
    assert [type(reply) for reply in out[1:5]] == [
        JobNotActive,
        JobNotFound,
        LeaseLost,
        JobCancelled,
    ]
    assert str(out[1]) == "job 'b' in queue 'q' is completed"
    assert out[0] == out[5] == out[6] == out[7] == T0 + 1090 == held["e"].lease_deadline
    assert {i: score(tmq, q, "active", i) for q, i in [("q", "a"), ("r", "f"), ("r", "g")]} == {
        "a": T0 + 1090, "f": T0 + 100, "g": T0 + 100}  # fmt: skip
    assert score(tmq, "q", "active", "b") is None and held["g"].lease_deadline == T0 + 100
    rule = r"lease_ms must be a whole number from 1 to 31,536,000,000 \(ms\), got "
    with pytest.raises(ValueError, match=rule + "0"):
        tmq.extend_leases([held["c"]], {"q": 0})
    with pytest.raises(ValueError, match=rule + "9223372036854775808"):  # it came back negative
        tmq.extend_leases([held["c"]], 2**63)
    with pytest.raises(ValueError, match=rule + "0"):  # checked with no job too
        tmq.extend_leases([], 0)
    assert score(tmq, "q", "active", "c") == T0 + 1090  # nothing written
    assert tmq.extend_leases([]) == []


def test_promote_delayed_moves_due_jobs_in_run_at_order(tmq, clock) -> None:
    for job_id, delay in (("c", 300), ("a", 100), ("b", 200), ("z", 10_000)):
        tmq.enqueue("q", "n", job_id=job_id, delay_ms=delay)
    clock.advance(99)
    assert tmq.timers.promote_delayed("q") == 0
    clock.advance(201)
    assert tmq.timers.promote_delayed("q", limit=2) == 2
    assert tmq.timers.promote_delayed("q") == 1
    assert [j.id for j in tmq.claim("q", 5)] == ["a", "b", "c"]
    assert_state(tmq, "q", "z", "delayed")


def test_recover_stalled_then_dies_past_the_stall_limit(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="j", max_attempts=10)
    first = claim_one(tmq, "q", "j", lease_ms=100)
    clock.advance(100)  # deadline == now: not expired yet
    assert tmq.timers.recover_stalled("q", max_stalls=1).recovered == 0
    clock.advance(1)
    outcome = tmq.timers.recover_stalled("q", max_stalls=1)
    assert (outcome.recovered, outcome.dead) == (1, [])
    r = assert_state(tmq, "q", "j", "pending")
    assert (r["stalls"], "lease" in r) == ("1", False)
    second = claim_one(tmq, "q", "j", lease_ms=100)
    assert (second.attempts, second.stalls) == (2, 0) and second.lease != first.lease
    clock.advance(101)
    outcome = tmq.timers.recover_stalled("q", max_stalls=1)
    assert (outcome.recovered, outcome.dead) == (0, [("q", "j")])
    r = assert_state(tmq, "q", "j", "dead")
    assert r["error"] == "stalled 2 times (lease expired; limit 1)"


def test_retry_brings_a_dead_job_back(tmq) -> None:
    tmq.enqueue("q", "n", job_id="j", max_attempts=1)
    assert tmq.fail(claim_one(tmq, "q", "j"), "boom") is JobState.DEAD
    outcome = tmq.retry("q", "j")
    assert (outcome.state, outcome.retried) == (JobState.PENDING, [("q", "j")])
    r = assert_state(tmq, "q", "j", "pending")
    assert (r["attempts"], r["stalls"], "error" in r, "finished_at" in r) == (
        "0",
        "0",
        False,
        False,
    )
    tmq.complete(claim_one(tmq, "q", "j"), 5)
    assert assert_state(tmq, "q", "j", "completed")["attempts"] == "1"


@pytest.mark.parametrize("state", ["pending", "active", "delayed", "completed"])
def test_retry_refuses_a_job_that_is_not_dead(tmq, state) -> None:
    tmq.enqueue("q", "n", job_id="j", delay_ms=5 if state == "delayed" else 0)
    if state in ("active", "completed"):
        job = claim_one(tmq, "q", "j")
        if state == "completed":
            tmq.complete(job)
    before = snapshot(tmq.client)
    with pytest.raises(JobNotRetryable) as exc:
        tmq.retry("q", "j")
    assert str(exc.value) == f"job 'j' in queue 'q' is {state}; only a dead job can be retried"
    assert snapshot(tmq.client) == before
    with pytest.raises(JobNotFound, match="job 'ghost' not found in queue 'q'"):
        tmq.retry("q", "ghost")


def test_get_job_unknown(mq) -> None:
    with pytest.raises(JobNotFound, match="^job 'x' not found in queue 'q'$"):
        mq.get_job("q", "x")


def closed_port() -> int:
    with socket.socket() as s:  # bound then released: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("call", ["enqueue", "claim", "get_job", "retry", "add_flow"])
def test_redis_down_names_where(call) -> None:
    port = closed_port()
    mq = EchoMQ(redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0)))
    calls = {
        "enqueue": lambda: mq.enqueue("q", "n"),
        "claim": lambda: mq.claim("q"),
        "get_job": lambda: mq.get_job("q", "j"),
        "retry": lambda: mq.retry("q", "j"),
        "add_flow": lambda: mq.add_flow(echomq_django.Flow("q", "n")),
    }
    with pytest.raises(
        RedisUnavailable, match=f"Redis is unreachable at redis://127.0.0.1:{port}/0"
    ):
        calls[call]()


@pytest.fixture
def settings_mq(r, redis_server):
    """The module-level API over the testproject settings; ECHOMQ_URL (set by
    the rig) points it at the private server."""
    reset()
    yield echomq_django.conf.get_mq()
    reset()


def test_module_level_api(settings_mq, redis_server, r) -> None:
    assert settings_mq.client.connection_pool.connection_kwargs["port"] == int(
        redis_server.rsplit(":", 1)[1].split("/")[0]
    )
    job_id = echomq_django.enqueue("orders", "orders.send_receipt", {"order": 42})
    job = echomq_django.get_job("orders", job_id)
    assert (job.state, job.payload, job.max_attempts, job.backoff_ms) == (
        JobState.PENDING,
        {"order": 42},
        3,
        200,
    )  # testproject's QUEUES["orders"]
    # added as pending: the row holds no state (a default is not stored)
    assert r.hmget(f"emq:{{orders}}:job:{job_id}", "s", "n") == [None, b"orders.send_receipt"]
    settings_mq.fail(claim_one(settings_mq, "orders", job_id), "x", dead=True)
    assert echomq_django.retry("orders", job_id).state is JobState.PENDING
    with pytest.raises(JobNotRetryable, match="is pending"):
        echomq_django.retry("orders", job_id)
    with pytest.raises(JobNotFound):
        echomq_django.get_job("orders", "missing")
