"""What a job's options do, on both rigs: a dedup key (on a plain job and on
a flow's leaf), a delay (on flow nodes too), a priority, a postpone; the
queue's pause and rate limit, which gate every claim; the ranges every
option must keep, refused before anything is written; and the same options
through the module API."""

from __future__ import annotations

import pytest

from echomq_django import (
    EchoMQ,
    FlowError,
    LeaseLost,
)
from echomq_django.runners.pump import Pump
from tests.support import jobkit
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    counter,
    hash_of,
    kill,
    leaf,
    node,
    ref,
    row,
    snapshot,
)

# -- dedup_key ------------------------------------------------------------------


def dedup_holder(mq, key: str, queue: str = "q"):
    v = mq.client.get(mq.keys.queue(queue).dedup(key))
    return None if v is None else v.decode()


def test_enqueue_with_a_live_dedup_key_returns_the_live_id_and_writes_nothing(tmq) -> None:
    assert tmq.enqueue("q", "n", 1, job_id="a", dedup_key="k") == "a"
    before = snapshot(tmq.client)
    assert tmq.enqueue("q", "n", 2, job_id="b", dedup_key="k") == "a"
    assert tmq.enqueue("q", "n", 3, dedup_key="k") == "a"
    assert snapshot(tmq.client) == before
    job = claim_one(tmq, "q", "a")  # still live while active
    assert tmq.enqueue("q", "n", 2, job_id="b", dedup_key="k") == "a"
    tmq.complete(job, "ok")
    assert dedup_holder(tmq, "k") is None  # freed when it finished: bounded keys
    assert tmq.enqueue("q", "n", 2, job_id="b", dedup_key="k") == "b"
    assert (dedup_holder(tmq, "k"), row(tmq, "q", "b")["dedup"]) == ("b", "k")


def test_a_dead_job_frees_its_dedup_key(tmq) -> None:
    tmq.enqueue("q", "n", job_id="a", dedup_key="k")
    kill(tmq, "a")
    assert dedup_holder(tmq, "k") is None
    assert tmq.enqueue("q", "n", job_id="b", dedup_key="k") == "b"


def test_a_dedup_ttl_frees_the_key_early(tmq) -> None:
    tmq.enqueue("q", "n", job_id="a", dedup_key="k", dedup_ttl_ms=60_000)
    pttl = tmq.client.pttl(tmq.keys.queue("q").dedup("k"))
    assert 0 < pttl <= 60_000
    tmq.client.delete(tmq.keys.queue("q").dedup("k"))  # what the ttl does
    assert tmq.enqueue("q", "n", job_id="b", dedup_key="k") == "b"
    assert_state(tmq, "q", "a", "pending")  # both live now: the ttl said so


def test_a_key_naming_a_finished_or_missing_job_is_free(tmq) -> None:
    tmq.client.set(tmq.keys.queue("q").dedup("k"), "gone")
    assert tmq.enqueue("q", "n", job_id="b", dedup_key="k") == "b"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dedup_key": "a:b"}, "invalid dedup_key 'a:b'"),
        ({"dedup_key": ""}, "invalid dedup_key ''"),
        ({"dedup_ttl_ms": 5}, "dedup_ttl_ms needs a dedup_key"),
        ({"dedup_key": "k", "dedup_ttl_ms": 0}, "dedup_ttl_ms must be a whole number from 1"),
        ({"priority": 1.5}, "priority must be a whole number from -1000000 to 1000000"),
        ({"priority": 10**7}, "priority must be a whole number"),
        ({"priority": True}, "priority must be a whole number"),
        ({"timeout_ms": 0}, "timeout_ms must be a whole number from 1"),
        ({"delay_ms": 10**15}, "delay_ms must be a whole number from 0 to 315360000000 ms"),
    ],
)
def test_bad_scheduling_options_are_refused_before_any_write(mq, kwargs, message) -> None:
    before = snapshot(mq.client)
    with pytest.raises(ValueError, match=message):
        mq.enqueue("q", "n", **kwargs)
    assert snapshot(mq.client) == before


def test_a_deduplicated_leaf_is_not_added_and_its_parent_stops_waiting(tmq) -> None:
    tmq.enqueue("q", "n", job_id="live", dedup_key="k")
    ref_ = tmq.add_flow(node("p", [leaf("c1", dedup_key="k"), leaf("c2")]))
    assert (ref_.landed, ref_.deduplicated) == (2, {("q", "c1"): "live"})
    assert not tmq.client.exists(tmq.keys.job("q", "c1"))
    assert counter(tmq, "q", "p") == 1
    assert hash_of(tmq, ref(tmq, "p") + ":removed") == {
        ref(tmq, "c1"): "deduplicated: job live holds key k"
    }
    assert complete(tmq, "live").released == []  # the live job is no child of p
    assert complete(tmq, "c2", 2).released == [("q", "p")]


def test_a_deduplicated_cross_queue_leaf_resolves_its_parent_through_the_outbox(tmq) -> None:
    tmq.enqueue("other", "n", job_id="live", dedup_key="k")
    ref_ = tmq.add_flow(node("p", [leaf("c1", queue="other", dedup_key="k")]))
    assert ref_.deduplicated == {("other", "c1"): "live"}
    assert_state(tmq, "q", "p", "awaiting_children")
    Pump(["other"], mq=tmq).sweep()
    assert_state(tmq, "q", "p", "pending")


def test_a_flow_leaf_with_a_free_key_holds_it_until_it_finishes(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c1", dedup_key="k", dedup_ttl_ms=5000)]))
    assert dedup_holder(tmq, "k") == "c1"
    assert tmq.enqueue("q", "n", job_id="x", dedup_key="k") == "c1"
    complete(tmq, "c1")
    assert dedup_holder(tmq, "k") is None


@pytest.mark.parametrize(
    "flow, message",
    [
        (node("p", [leaf("c")], dedup_key="k"), "dedup_key is for leaf nodes only"),
        (node("p", [node("m", [leaf("c")], dedup_key="k")]), "dedup_key is for leaf nodes"),
        (node("p", [leaf("a", dedup_key="k"), leaf("b", dedup_key="k")]), "used twice"),
        (node("p", [leaf("c", children_timeout_ms=5)]), "children_timeout_ms is for a node"),
        (
            node(
                "p",
                [leaf("c", continue_parent_on_failure=True, remove_dependency_on_failure=True)],
            ),
            "continue_parent_on_failure cannot be combined",
        ),
        (node("p", [leaf("c", priority=-(10**7))]), "q/c: priority must be a whole number"),
        (node("p", [leaf("c", delay_ms=-1)]), "q/c: delay_ms must be a whole number from 0"),
    ],
)
def test_bad_flow_options_are_refused(mq, flow, message) -> None:
    before = snapshot(mq.client)
    with pytest.raises(FlowError, match=message):
        mq.add_flow(flow)
    assert snapshot(mq.client) == before


# -- delay_ms on flow nodes -------------------------------------------------------


def test_a_delayed_leaf_lands_delayed(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1", delay_ms=500), leaf("c2")]))
    assert_state(tmq, "q", "c1", "delayed")
    assert jobkit.score(tmq, "q", "delayed", "c1") == clock.now + 500
    clock.advance(500)
    assert tmq.timers.promote_delayed("q") == 1
    assert_state(tmq, "q", "c1", "pending")


def test_a_delayed_parent_waits_for_its_children_and_its_delay(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1")], delay_ms=1000))
    clock.advance(400)
    assert complete(tmq, "c1").released == [("q", "p")]
    assert_state(tmq, "q", "p", "delayed")  # children done, delay not over
    assert jobkit.score(tmq, "q", "delayed", "p") == clock.now + 600
    clock.advance(600)
    tmq.timers.promote_delayed("q")
    assert_state(tmq, "q", "p", "pending")


def test_a_delayed_parent_whose_delay_passed_is_released_to_pending(tmq, clock) -> None:
    tmq.add_flow(node("p", [leaf("c1")], delay_ms=100))
    clock.advance(100)
    complete(tmq, "c1")
    assert_state(tmq, "q", "p", "pending")


# -- postpone (RateLimited) -----------------------------------------------------


def test_postpone_puts_the_job_back_without_spending_its_attempt(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="a", max_attempts=1)
    job = claim_one(tmq, "q", "a")
    assert tmq.timers.postpone(job, 250) == clock.now + 250
    r = assert_state(tmq, "q", "a", "delayed")
    assert r["attempts"] == "0"
    assert tmq.timers.postpone(job, 250) == clock.now + 250  # a replay answers the same
    clock.advance(250)
    tmq.timers.promote_delayed("q")
    assert claim_one(tmq, "q", "a").attempts == 1
    with pytest.raises(LeaseLost):
        tmq.timers.postpone(job, 1)  # the old lease cannot postpone the new attempt


# -- priority ------------------------------------------------------------------------------


def ids_of(jobs) -> list[str]:
    return [j.id for j in jobs]


def test_higher_priority_first_fifo_within_a_priority(tmq) -> None:
    for job_id, p in (("a", 0), ("b", 5), ("c", -1), ("d", 5), ("e", 0), ("f", 9), ("g", -1)):
        tmq.enqueue("q", "n", job_id=job_id, priority=p)
    assert row(tmq, "q", "b")["priority"] == "5" and "priority" not in row(tmq, "q", "a")
    assert_state(tmq, "q", "b", "pending")
    assert ids_of(tmq.claim("q", 2)) == ["f", "b"]
    assert ids_of(tmq.claim("q", 10)) == ["d", "a", "e", "c", "g"]
    assert tmq.client.exists(tmq.keys.queue_key("q", "prioritized")) == 0


def test_priority_is_kept_across_retries_recovery_and_promotion(tmq, clock) -> None:
    tmq.enqueue("q", "n", job_id="lo")
    tmq.enqueue("q", "n", job_id="hi", priority=3, backoff_ms=0, max_attempts=5)
    job = claim_one(tmq, "q", "hi")
    tmq.fail(job, "again")  # no backoff: straight back to pending, at its priority
    assert ids_of(tmq.claim("q", 1, lease_ms=10)) == ["hi"]
    clock.advance(11)
    tmq.timers.recover_stalled("q")  # lease expired: back at its priority
    job = claim_one(tmq, "q", "hi")
    tmq.timers.postpone(job, 5)
    clock.advance(5)
    tmq.timers.promote_delayed("q")
    job = claim_one(tmq, "q", "hi")
    tmq.fail(job, "dead", dead=True)
    tmq.retry("q", "hi")
    assert ids_of(tmq.claim("q", 2)) == ["hi", "lo"]


def test_a_released_parent_goes_to_the_front_of_its_priority(tmq) -> None:
    tmq.add_flow(node("p", [leaf("c", priority=1)], priority=1))
    tmq.add_flow(node("p0", [leaf("c0")]))
    for i in range(3):
        tmq.enqueue("q", "n", job_id=f"x{i}", priority=1)
        tmq.enqueue("q", "n", job_id=f"y{i}")
    assert tmq.complete(claim_one(tmq, "q", "c"), 1).released == [("q", "p")]
    assert ids_of(tmq.claim("q", 2)) == ["p", "x0"]
    assert tmq.complete(claim_one(tmq, "q", "x1"), 1).released == []
    claim_one(tmq, "q", "x2")
    assert tmq.complete(claim_one(tmq, "q", "c0"), 1).released == [("q", "p0")]
    assert ids_of(tmq.claim("q", 4)) == ["p0", "y0", "y1", "y2"]


def test_a_killed_or_removed_prioritized_job_leaves_the_zset(tmq) -> None:
    tmq.add_flow(node("p", [leaf("a", priority=2), leaf("b", priority=2)], children_timeout_ms=1))
    deleted, _ = tmq.remove_unprocessed_children("q", "p")
    assert sorted(deleted) == [("q", "a"), ("q", "b")]
    assert tmq.client.zcard(tmq.keys.queue_key("q", "prioritized")) == 0


def test_reads_count_and_list_pending_jobs_in_claim_order(tmq) -> None:
    for job_id, p in (("a", 0), ("b", 2), ("c", -3), ("d", 0)):
        tmq.enqueue("q", "n", job_id=job_id, priority=p)
    assert tmq.counts("q")["pending"] == 4
    assert tmq.job_ids("q", "pending") == ["b", "a", "d", "c"]
    assert tmq.job_ids("q", "pending", 1, 2) == ["a", "d"]
    assert [j.id for j in tmq.claim("q", 4)] == ["b", "a", "d", "c"]


# -- pause and the rate limit -----------------------------------------------------------


def test_pause_and_resume_are_flags_with_events(tmq) -> None:
    assert (tmq.is_paused("q"), tmq.pause("q"), tmq.pause("q")) == (False, True, False)
    assert tmq.is_paused("q")
    assert (tmq.resume("q"), tmq.resume("q"), tmq.is_paused("q")) == (True, False, False)
    assert [f[b"e"] for _, f in tmq.client.xrange(tmq.keys.queue_key("q", "events"))] == [
        b"paused",
        b"resumed",
    ]


def test_a_paused_queue_is_not_claimed_from_and_resume_wakes_it(tmq) -> None:
    tmq.enqueue("q", "n", job_id="a")
    tmq.pause("q")
    got = tmq.claim("q", 5)
    assert (list(got), got.paused, got.wait_ms) == ([], True, None)
    wake = tmq.keys.queue_key("q", "wake")
    assert tmq.client.zscore(wake, "0") is None  # idle workers sleep, they don't spin
    tmq.enqueue("q", "n", job_id="b")  # adds go on while paused
    tmq.claim("q", 5)
    tmq.resume("q")
    assert tmq.client.zscore(wake, "0") == 0
    got = tmq.claim("q", 5)
    assert (ids_of(got), got.paused) == (["a", "b"], False)


def test_the_rate_limit_holds_for_all_workers_by_window(redis_client, clock) -> None:
    limits = {"q": {"RATE_LIMIT": {"MAX": 3, "PER_MS": 1000}}}
    a, b = (EchoMQ(redis_client, prefix="emq", clock=clock, queues=limits) for _ in "ab")
    for i in range(8):
        a.enqueue("q", "n", job_id=f"j{i}")
    assert ids_of(a.claim("q", 2)) == ["j0", "j1"]
    clock.advance(100)
    assert ids_of(b.claim("q", 5)) == ["j2"]  # the window had room for one more
    got = a.claim("q", 5)
    assert (list(got), got.wait_ms) == ([], 900)
    clock.advance(900)
    assert ids_of(b.claim("q", 5)) == ["j3", "j4", "j5"]  # a new window
    assert b.claim("q", 1).wait_ms == 1000


# -- the same options through the module API -----------------------------------


def test_the_module_api_over_the_settings_connection(r) -> None:
    import echomq_django as emq
    from echomq_django import conf

    conf.reset()
    try:
        assert emq.enqueue("q", "t.echo", 1, job_id="a", dedup_key="k", on_commit=False) == "a"
        assert emq.enqueue("q", "t.echo", 2, dedup_key="k", on_commit=False) == "a"
        emq.enqueue("q", "t.echo", 3, job_id="b", priority=4, timeout_ms=50, on_commit=False)
        assert (emq.pause("q"), emq.is_paused("q"), emq.resume("q")) == (True, True, True)
        emq.add_flow(node("p", [leaf("c1"), leaf("c2")]), on_commit=False)
        mq = conf.get_mq()
        assert emq.remove_child_dependency("q", "p", mq.keys.job("q", "c1")).released == []
        deleted, outcome = emq.remove_unprocessed_children("q", "p")
        assert (deleted, outcome.released) == ([("q", "c2")], [("q", "p")])
        job = mq.claim("q", 1)[0]
        assert (job.id, job.priority, job.timeout_ms) == ("b", 4, 50)
    finally:
        conf.reset()
