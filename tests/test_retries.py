"""Retry policies and expiry before start (docs/howto/retries.md): the
decision in the worker (unit), the fail script's delay, the claim's expiry,
and the bad input refused before any write, on both rigs."""

from __future__ import annotations

import logging

import pytest

from echomq_django import EchoMQ, Flow, JobState, Retry, Worker, handler
from echomq_django.conf import schema
from echomq_django.core.retry import decide, job_retry
from echomq_django.runners.pump import Pump
from tests.support.jobkit import callback_jobs, claim_one, raw_row, score, snapshot
from tests.support.workerkit import T0, Clock

CAP = 3_600_000
CALLS: list = []  # (attempt, error type) the backoff function saw


def backoff_fn(attempt, error):
    """A backoff function: 100 ms per attempt."""
    CALLS.append((attempt, type(error).__name__))
    return 100 * attempt


def negative_backoff(attempt, error):
    return -5


not_callable = 42


class Flaky(Exception):
    """A retried error."""


@handler("r.raise")
def raise_it(job):
    """Raises what the payload names: ``flaky``, ``value``, ``retry`` (Retry(250))."""
    kind = job.payload["raise"]
    if kind == "retry":
        raise Retry(250)
    raise {"flaky": Flaky, "value": ValueError}[kind]("it broke")


# -- the decision (unit) ---------------------------------------------------
@pytest.mark.parametrize(
    "backoff, attempt, expected",
    [
        ("exponential", 1, 1000),
        ("exponential", 3, 4000),
        ("fixed", 3, 1000),
        ([10, 20, 30], 2, 20),
        ([10, 20, 30], 7, 30),  # past the list: its last delay
        ("tests.test_retries.backoff_fn", 3, 300),
    ],
)
def test_each_backoff_shape_gives_its_delay(backoff, attempt, expected):
    d = decide(ValueError("x"), attempt, 1000, CAP, {}, job_retry(backoff))
    assert (d.dead, d.delay_ms, d.note) == (False, expected, None)


def test_the_queue_setting_applies_when_the_job_has_none_and_the_cap_bounds_it():
    d = decide(ValueError("x"), 1, 1000, 50, {"BACKOFF": [500]}, None)
    assert (d.dead, d.delay_ms) == (False, 50)


def test_the_job_policy_wins_over_the_queue_setting():
    d = decide(ValueError("x"), 1, 1000, CAP, {"BACKOFF": "fixed"}, job_retry([7]))
    assert d.delay_ms == 7


def test_jitter_shortens_the_delay_by_up_to_its_fraction():
    policy = job_retry("fixed", 0.5)
    assert decide(ValueError(), 1, 1000, CAP, {}, policy, rand=lambda: 0.0).delay_ms == 1000
    assert decide(ValueError(), 1, 1000, CAP, {}, policy, rand=lambda: 0.5).delay_ms == 750
    assert decide(ValueError(), 1, 1000, CAP, {}, policy, rand=lambda: 0.999).delay_ms == 500
    queue = {"JITTER": 1}
    assert decide(ValueError(), 1, 1000, CAP, queue, None, rand=lambda: 0.25).delay_ms == 750


def test_retry_on_and_dont_retry_on_decide_which_errors_die_at_once():
    only_flaky = job_retry(retry_on=[Flaky])
    assert decide(Flaky(), 1, 10, CAP, {}, only_flaky).dead is False
    assert decide(ValueError(), 1, 10, CAP, {}, only_flaky).dead is True
    not_value = job_retry(dont_retry_on="builtins.ValueError")
    assert decide(ValueError(), 1, 10, CAP, {}, not_value).dead is True
    assert decide(KeyError(), 1, 10, CAP, {}, not_value).dead is False
    queue = {"DONT_RETRY_ON": [LookupError]}  # a subclass matches too
    assert decide(KeyError(), 1, 10, CAP, queue, None).dead is True


def test_retry_asks_for_its_delay_whatever_the_policy():
    policy = job_retry("fixed", 1, retry_on=[Flaky])
    d = decide(Retry(250), 3, 1000, 10, {}, policy, rand=lambda: 0.5)
    assert (d.dead, d.delay_ms) == (False, 250)


def test_a_backoff_function_gets_the_attempt_and_the_exception():
    CALLS.clear()
    decide(Flaky("x"), 2, 0, CAP, {"BACKOFF": "tests.test_retries.backoff_fn"}, None)
    assert CALLS == [(2, "Flaky")]


def test_a_backoff_function_returning_a_bad_delay_falls_back_to_exponential_and_says_so():
    d = decide(ValueError(), 2, 1000, CAP, {}, job_retry("tests.test_retries.negative_backoff"))
    assert (d.dead, d.delay_ms) == (False, 2000)
    assert d.note == (
        "backoff function 'tests.test_retries.negative_backoff' returned -5, not a whole "
        "number of ms from 0 to 315360000000; the exponential backoff (2000 ms) was used"
    )


# -- bad input: refused before any write -------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        ({"backoff": "linear"}, "backoff function 'linear' is not a dotted path"),
        ({"backoff": "no_such_module.f"}, "backoff function 'no_such_module.f' does not import"),
        ({"backoff": "tests.test_retries.not_callable"}, "is not callable"),
        ({"backoff": [10, -1]}, "bad backoff [10, -1]"),
        ({"backoff": []}, "bad backoff []"),
        ({"jitter": 1.5}, "bad jitter 1.5: jitter is a number from 0 to 1"),
        ({"jitter": True}, "bad jitter True"),
        ({"retry_on": [int]}, "'builtins.int' is not an exception class"),
        ({"dont_retry_on": "nowhere.Error"}, "dont_retry_on class 'nowhere.Error' does not import"),
        ({"expires_ms": 0}, "expires_ms must be a whole number from 1 to 315360000000 ms"),
        ({"expires_ms": 1.5}, "expires_ms must be a whole number"),
    ],
)
def test_a_bad_policy_is_refused_before_any_write(mq, options, message):
    before = snapshot(mq.client)
    with pytest.raises(ValueError) as err:
        mq.enqueue("q", "r.raise", {}, **options)
    assert message in str(err.value)
    with pytest.raises(ValueError) as err:
        mq.add_flow(Flow("q", "r.raise", children=[Flow("q", "r.raise", **options)]))
    assert message in str(err.value)
    assert snapshot(mq.client) == before


def test_an_unknown_keyword_is_a_type_error(mq):
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['bakoff'\]"):
        mq.enqueue("q", "r.raise", {}, bakoff="fixed")


def test_a_local_exception_class_is_refused():
    class Local(Exception):
        pass

    with pytest.raises(ValueError, match="does not import"):
        job_retry(retry_on=[Local])


def test_the_system_check_names_each_bad_queue_setting():
    cfg = {
        "URL": "redis://localhost:1/0",
        "QUEUES": {
            "q": {
                "BACKOFF": "sometimes",
                "JITTER": -0.1,
                "RETRY_ON": ["nowhere.Error"],
                "EXPIRES_MS": 0,
            },
            "ok": {"BACKOFF": [1, 2], "JITTER": 0.3, "DONT_RETRY_ON": [ValueError]},
        },
    }
    ids = sorted(cid for cid, _, _ in schema.problems(cfg))
    assert ids == [
        "echomq_django.E110",
        "echomq_django.E111",
        "echomq_django.E112",
        "echomq_django.E113",
    ]


# -- the worker and the fail script ------------------------------------------
def _run(mq, queues=("q",)):
    return Worker(list(queues), concurrency=2, mq=mq).run(burst=True)


def test_a_fixed_backoff_with_jitter_delays_the_retry_in_its_range(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock)
    mq.enqueue("q", "r.raise", {"raise": "flaky"}, job_id="j", backoff="fixed", jitter=0.5)
    _run(mq)
    job = mq.get_job("q", "j")
    assert (job.state, job.attempts) == (JobState.DELAYED, 1)
    assert T0 + 500 <= score(mq, "q", "delayed", "j") <= T0 + 1000


def test_a_list_backoff_from_the_queue_setting(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock, queues={"q": {"BACKOFF": [40, 90]}})
    mq.enqueue("q", "r.raise", {"raise": "flaky"}, job_id="j")
    _run(mq)
    assert score(mq, "q", "delayed", "j") == T0 + 40
    clock.advance(40)
    mq.timers.promote_delayed("q")
    _run(mq)
    assert score(mq, "q", "delayed", "j") == T0 + 40 + 90
    assert mq.get_job("q", "j").attempts == 2


def test_dont_retry_on_kills_at_once_with_attempts_left(mq):
    mq.enqueue("q", "r.raise", {"raise": "value"}, job_id="j", dont_retry_on=[ValueError])
    _run(mq)
    job = mq.get_job("q", "j")
    assert (job.state, job.attempts, job.max_attempts) == (JobState.DEAD, 1, 3)
    assert job.error.startswith("ValueError: it broke")


def test_retry_on_retries_only_its_errors(mq):
    mq.enqueue("q", "r.raise", {"raise": "flaky"}, job_id="a", retry_on=[Flaky])
    mq.enqueue("q", "r.raise", {"raise": "value"}, job_id="b", retry_on=[Flaky])
    _run(mq)
    a, b = mq.get_job("q", "a"), mq.get_job("q", "b")
    assert (a.state, a.attempts, a.error.splitlines()[0]) == (
        JobState.DELAYED,
        1,
        "Flaky: it broke",
    )
    assert (b.state, b.attempts, b.error.splitlines()[0]) == (
        JobState.DEAD,
        1,
        "ValueError: it broke",
    )


def test_retry_from_a_handler_waits_its_delay_and_counts_the_attempt(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock)
    mq.enqueue("q", "r.raise", {"raise": "retry"}, job_id="j", max_attempts=2)
    _run(mq)
    job = mq.get_job("q", "j")
    assert (job.state, job.attempts) == (JobState.DELAYED, 1)
    assert score(mq, "q", "delayed", "j") == T0 + 250
    assert job.error.startswith("Retry: retry asked in 250 ms")
    clock.advance(250)
    mq.timers.promote_delayed("q")
    _run(mq)
    assert (mq.get_job("q", "j").state, mq.get_job("q", "j").attempts) == (JobState.DEAD, 2)


def test_a_bad_backoff_function_at_run_time_retries_exponentially_and_says_so(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock)
    mq.enqueue(
        "q",
        "r.raise",
        {"raise": "flaky"},
        job_id="j",
        backoff="tests.test_retries.negative_backoff",
    )
    _run(mq)
    job = mq.get_job("q", "j")
    assert score(mq, "q", "delayed", "j") == T0 + 1000
    assert job.error.splitlines()[-1] == (
        "backoff function 'tests.test_retries.negative_backoff' returned -5, not a whole "
        "number of ms from 0 to 315360000000; the exponential backoff (1000 ms) was used"
    )


def test_fail_with_a_delay_uses_it_and_refuses_a_bad_one(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="j")
    job = claim_one(tmq, "q", "j")
    with pytest.raises(ValueError, match="delay_ms must be"):
        tmq.fail(job, "boom", delay_ms=-1)
    assert tmq.fail(job, "boom", delay_ms=123) is JobState.DELAYED
    assert score(tmq, "q", "delayed", "j") == clock.now + 123


def test_a_flow_node_keeps_its_own_policy(mq):
    mq.add_flow(
        Flow("q", "x", job_id="p", children=[Flow("q", "x", job_id="c", backoff=[5], jitter=0.1)])
    )
    assert raw_row(mq, "q", "c")["retry_policy"] == '{"b":[5],"j":0.1}'
    assert "retry_policy" not in raw_row(mq, "q", "p")


# -- expiry before start -------------------------------------------------------
def test_an_expired_job_dies_at_claim_and_the_claim_takes_the_next(tmq, clock, caplog):
    """The claim kills it, takes the next, names it in ``Claimed.expired``
    and says so in one WARNING (no handler runs: the worker's log is where
    it shows); a claim that only killed says so too."""
    tmq.enqueue("q", "x", {}, job_id="old", expires_ms=1000)
    tmq.enqueue("q", "x", {}, job_id="new")
    assert raw_row(tmq, "q", "old")["expires_at"] == str(clock.now + 1000)
    clock.advance(1000)
    with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
        claimed = tmq.claim("q", 1)
    assert ([j.id for j in claimed], claimed.expired) == (["new"], [("old", "x")])
    old = tmq.get_job("q", "old")
    assert (old.state, old.error, old.attempts) == (JobState.DEAD, "expired", 0)
    assert tmq.job_ids("q", "dead") == ["old"]
    assert [r.getMessage() for r in caplog.records] == [
        "queue 'q': 1 jobs were past their expiry when claimed and died with the error "
        "'expired' (no handler ran): old (x)"
    ]
    for i in range(12):
        tmq.enqueue("q", "y", {}, job_id=f"e{i:02}", expires_ms=10)
    clock.advance(10)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
        claimed = tmq.claim("q", 5)
    assert (list(claimed), len(claimed.expired)) == ([], 12)
    assert caplog.records[0].getMessage().endswith("e08 (y), e09 (y) and 2 more")


def test_a_job_claimed_before_its_expiry_runs(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="j", expires_ms=1000, delay_ms=500)
    assert raw_row(tmq, "q", "j")["expires_at"] == str(clock.now + 1500)  # after it is due
    clock.advance(1499)
    tmq.timers.promote_delayed("q")
    assert [j.id for j in tmq.claim("q", 5)] == ["j"]


def test_a_retried_job_does_not_expire(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="j", expires_ms=1000, backoff_ms=0)
    job = claim_one(tmq, "q", "j")
    tmq.fail(job, "boom")  # back to pending: it started once
    clock.advance(5000)
    assert [j.id for j in tmq.claim("q", 1)] == ["j"]


def test_the_queue_default_expires_jobs_and_flow_nodes(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock, queues={"q": {"EXPIRES_MS": 100}})
    mq.enqueue("q", "x", {}, job_id="j")
    mq.add_flow(Flow("q", "x", job_id="p", children=[Flow("q", "x", job_id="c")]))
    assert raw_row(mq, "q", "j")["expires_at"] == str(T0 + 100)
    assert raw_row(mq, "q", "c")["expires_at"] == str(T0 + 100)
    clock.advance(100)
    assert mq.claim("q", 5) == []
    assert sorted(mq.job_ids("q", "dead")) == ["c", "j", "p"]  # c's death failed its parent
    assert mq.get_job("q", "p").error.startswith("failed by child")


def test_an_expired_child_follows_its_policy_across_queues(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock)
    mq.add_flow(
        Flow(
            "parents",
            "x",
            job_id="p",
            children=[
                Flow("kids", "x", job_id="late", expires_ms=10, ignore_dependency_on_failure=True),
                Flow("kids", "x", job_id="ok"),
            ],
        )
    )
    clock.advance(10)
    [job] = mq.claim("kids", 2)
    assert job.id == "ok"
    mq.complete(job, 1)
    Pump(["kids", "parents"], mq=mq).sweep()
    parent = mq.get_job("parents", "p")
    assert parent.state is JobState.PENDING  # released: the ignored death and the result
    assert {str(k): v for k, v in mq.ignored_failures("parents", "p").items()} == {
        "kids/late": "expired"
    }


def test_a_retried_expired_job_runs(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="j", expires_ms=10)
    clock.advance(10)
    assert tmq.claim("q", 1) == []
    tmq.retry("q", "j")
    assert "expires_at" not in raw_row(tmq, "q", "j")
    assert [j.id for j in tmq.claim("q", 1)] == ["j"]


def test_a_rate_limited_job_that_started_does_not_expire(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="j", expires_ms=10)
    job = claim_one(tmq, "q", "j")
    tmq.timers.postpone(job, 0)  # RateLimited: its attempt given back
    clock.advance(100)
    tmq.timers.promote_delayed("q")
    assert [j.id for j in tmq.claim("q", 1)] == ["j"]


# -- callbacks ------------------------------------------------------------------
def test_on_success_adds_a_job_with_the_result_in_the_completing_script(tmq):
    tmq.enqueue("q", "x", {}, job_id="j", on_success="r.done", on_dead="r.dead")
    job = claim_one(tmq, "q", "j")
    tmq.complete(job, {"total": 3, "items": []})
    assert callback_jobs(tmq) == {"r.done": [{"job": "q/j", "result": {"total": 3, "items": []}}]}
    assert raw_row(tmq, "q", "j")["callbacks"] == '{"d":"r.dead","s":"r.done"}'


def test_a_job_id_added_again_gets_its_own_callback_job(tmq, clock):
    # the second life of id j counts its callbacks from 1 again: its callback
    # job is a new one, not the first life's (completed, kept), pushed again
    tmq.enqueue("q", "x", {}, job_id="j", on_success="r.done")
    tmq.complete(claim_one(tmq, "q", "j"), 1)
    (first,) = tmq.claim("q", 1)
    tmq.complete(first, "ran")
    tmq.remove("q", "j")
    clock.advance(1_000)
    tmq.enqueue("q", "x", {}, job_id="j", on_success="r.done")
    tmq.complete(claim_one(tmq, "q", "j"), 2)
    (second,) = tmq.claim("q", 1)
    assert (second.id != first.id, second.name, second.payload) == (
        True,
        "r.done",
        {"job": "q/j", "result": 2},
    )
    assert tmq.get_job("q", first.id).state is JobState.COMPLETED


def test_on_failure_per_retried_attempt_and_on_dead_at_the_death(tmq):
    tmq.enqueue(
        "q", "x", {}, job_id="j", max_attempts=2, backoff_ms=0, on_failure="r.f", on_dead="r.d"
    )
    tmq.fail(claim_one(tmq, "q", "j"), "first")
    tmq.fail(claim_one(tmq, "q", "j"), "second")
    assert callback_jobs(tmq) == {
        "r.f": [{"job": "q/j", "error": "first"}],
        "r.d": [{"job": "q/j", "error": "second"}],
    }


def test_on_dead_on_every_road_to_dead_expired_and_cancelled(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="late", expires_ms=5, on_dead="r.d")
    tmq.enqueue("q", "x", {}, job_id="gone", delay_ms=100, on_dead="r.d")
    clock.advance(5)
    [cb] = tmq.claim("q", 1)  # the expired job's callback job took its place
    assert (cb.name, cb.payload) == ("r.d", {"job": "q/late", "error": "expired"})
    tmq.cancel("q", "gone")
    assert callback_jobs(tmq) == {"r.d": [{"job": "q/gone", "error": "cancelled"}]}


def test_a_callback_job_runs_in_a_worker_as_its_own_job(mq):
    seen = []

    @handler("r.record_done")
    def record_done(job):
        seen.append(job.payload)

    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            on_success="r.record_done",
            children=[Flow("q", "t.echo", 2, job_id="c", on_success="r.record_done")],
        )
    )
    _run(mq)
    assert sorted(seen, key=lambda p: p["job"]) == [
        {"job": "q/c", "result": 2},
        {"job": "q/p", "result": 2},
    ]


def test_a_bad_callback_name_is_refused_before_any_write(mq):
    before = snapshot(mq.client)
    with pytest.raises(ValueError, match="on_success: invalid job name ''"):
        mq.enqueue("q", "x", {}, on_success="")
    with pytest.raises(ValueError, match="on_dead: invalid job name 3"):
        mq.add_flow(Flow("q", "x", on_dead=3))
    assert snapshot(mq.client) == before


def _wake(mq, queue="q"):
    raw = mq.client.zrange(mq.keys.queue_key(queue, "wake"), 0, -1, withscores=True)
    return {m.decode(): int(s) for m, s in raw}


def test_a_parent_an_expired_child_released_is_claimed_in_the_same_call(tmq, clock):
    kid = Flow("q", "x", job_id="c", expires_ms=5, continue_parent_on_failure=True)
    tmq.add_flow(Flow("q", "x", job_id="p", children=[kid]))
    clock.advance(5)
    assert [j.id for j in tmq.claim("q", 3)] == ["p"]  # c expired; its death released p
    assert tmq.get_job("q", "c").error == "expired"
    assert _wake(tmq) == {}  # drained


def test_a_job_an_expired_death_made_claimable_keeps_the_wake_marker(tmq, clock):
    tmq.enqueue("q", "x", {}, job_id="late", expires_ms=5, on_dead="r.d")
    tmq.enqueue("q", "x", {}, job_id="next")
    clock.advance(5)
    assert [j.id for j in tmq.claim("q", 1)] == ["next"]
    # the on_dead job waits: the next idle worker must wake for it
    assert _wake(tmq) == {"0": 0}
    [cb] = tmq.claim("q", 1)
    assert (cb.name, _wake(tmq)) == ("r.d", {})
