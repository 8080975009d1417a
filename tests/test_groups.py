"""Groups (tenants) inside a queue, on both rigs: claims go round the groups
with work one job per group per turn; GROUP_CONCURRENCY (the setting, and a
group's own cap at run time) counted in claim and freed by every way out of
active; pause_group / resume_group; a group's keys gone with its last job;
bad names refused before any write; a queue without groups writes no group
key. docs/explanation/protocol.md#groups"""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, Worker, task
from echomq_django.conf.schema import problems
from echomq_django.core.keyspace import GROUP_RULE
from echomq_django.monitoring.stats import collect, render
from tests.support.workerkit import Background, wait_for

CAPPED = {"q": {"GROUP_CONCURRENCY": 1}}


def ids_of(jobs):
    return [j.id for j in jobs]


def all_keys(mq, pattern):
    if isinstance(mq.client, RedisCluster):
        nodes = mq.client.get_primaries()
        return [k for n in nodes for k in mq.client.keys(pattern, target_nodes=n)]
    return mq.client.keys(pattern)


def group_keys(mq, queue="q"):
    """Every key of ``queue`` a group made (the ring, counters, a group's lists)."""
    base = mq.keys.queue(queue).base
    keys = [k.decode() for k in all_keys(mq, base + "*")]
    return sorted(k[len(base) :] for k in keys if k[len(base) :].startswith(("g:", "groups")))


def test_claims_go_round_the_groups_one_job_per_turn(redis_client) -> None:
    mq = EchoMQ(redis_client)
    for i in range(4):
        mq.enqueue("q", "n", job_id=f"big{i}", group="big")
    mq.enqueue("q", "n", job_id="a0", group="a")
    mq.enqueue("q", "n", job_id="b0", group="b")
    mq.enqueue("q", "n", job_id="a1", group="a")
    assert mq.client.hget(mq.keys.job("q", "a0"), "group") == b"a"
    order = [j.id for _ in range(7) for j in mq.claim("q", 1)]
    assert order == ["big0", "a0", "b0", "big1", "a1", "big2", "big3"]
    # one claim of many takes one job per group per turn, too
    for i in range(3):
        mq.enqueue("q", "n", job_id=f"x{i}", group="x")
    mq.enqueue("q", "n", job_id="y0", group="y")
    assert ids_of(mq.claim("q", 3)) == ["x0", "y0", "x1"]


def test_jobs_without_a_group_go_first_and_priorities_order_a_group(redis_client) -> None:
    mq = EchoMQ(redis_client)
    mq.enqueue("q", "n", job_id="g-low", group="g")
    mq.enqueue("q", "n", job_id="g-high", group="g", priority=5)
    mq.enqueue("q", "n", job_id="g-neg", group="g", priority=-1)
    mq.enqueue("q", "n", job_id="plain")
    assert ids_of(mq.claim("q", 4)) == ["plain", "g-high", "g-low", "g-neg"]


def test_a_group_at_its_cap_sits_out_until_a_job_of_it_leaves(redis_client) -> None:
    mq = EchoMQ(redis_client, queues=CAPPED)
    for i in range(3):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    mq.enqueue("q", "n", job_id="b0", group="b")
    a0, b0 = mq.claim("q", 5)
    assert (a0.id, b0.id) == ("a0", "b0")
    refused = mq.claim("q", 5)
    assert list(refused) == []
    # nothing claimable: idle workers block on the wake key, no spin
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") is None
    mq.complete(a0, 1)
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") == 0  # a worker is woken
    assert ids_of(mq.claim("q", 5)) == ["a1"]
    mq.fail(mq.claim("q", 1) or b0, "boom", dead=True)  # b0 leaves by failing
    assert mq.client.hget(mq.keys.queue("q").groups_active, "b") is None


def test_a_group_cap_set_at_run_time_wins_and_wakes(redis_client) -> None:
    mq = EchoMQ(redis_client, queues=CAPPED)
    for i in range(3):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    assert ids_of(mq.claim("q", 5)) == ["a0"]
    mq.groups.set_concurrency("q", "a", 3)
    assert mq.groups.concurrency("q", "a") == 3
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") == 0
    assert ids_of(mq.claim("q", 5)) == ["a1", "a2"]
    mq.groups.set_concurrency("q", "a", None)
    assert mq.groups.concurrency("q", "a") == 1  # the setting again
    with pytest.raises(ValueError, match="concurrency must be a whole number"):
        mq.groups.set_concurrency("q", "a", 0)


def test_pause_and_resume_a_group(redis_client) -> None:
    mq = EchoMQ(redis_client)
    mq.enqueue("q", "n", job_id="a0", group="a")
    mq.enqueue("q", "n", job_id="b0", group="b")
    assert mq.groups.pause("q", "a") is True
    assert mq.groups.pause("q", "a") is False  # already paused
    mq.enqueue("q", "n", job_id="a1", group="a")  # adds go on
    assert ids_of(mq.claim("q", 5)) == ["b0"]
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") is None  # nothing to wake for
    mq.enqueue("q", "n", job_id="a2", group="a")  # a paused group's add wakes nobody
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") is None
    assert list(mq.claim("q", 5)) == []
    assert mq.groups.resume("q", "a") is True
    assert mq.client.zscore(mq.keys.queue("q").wake, "0") == 0
    assert ids_of(mq.claim("q", 5)) == ["a0", "a1", "a2"]


def test_a_groups_keys_go_with_its_last_job(redis_client) -> None:
    mq = EchoMQ(redis_client, queues=CAPPED)
    mq.enqueue("q", "n", job_id="a0", group="a", priority=2)
    mq.enqueue("q", "n", job_id="a1", group="a")
    assert "g:a:pending" in group_keys(mq) and "g:a:prioritized" in group_keys(mq)
    job = mq.claim("q", 1)[0]
    mq.complete(job, 1)
    mq.complete(mq.claim("q", 1)[0], 2)
    assert list(mq.claim("q", 1)) == []
    # two counters are left (one string each per queue, not per group)
    assert group_keys(mq) == ["groups:pending", "groups:seq"]


def test_every_way_out_gives_the_groups_slot_back(redis_client) -> None:
    mq = EchoMQ(redis_client, queues=CAPPED)
    for i in range(4):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    # postponed
    job = mq.claim("q", 1)[0]
    mq.timers.postpone(job, 60_000)
    # failed with a retry (back to its group's list)
    job = mq.claim("q", 1)[0]
    assert job.id == "a1"
    mq.fail(job, "boom", delay_ms=0)
    job = mq.claim("q", 1)[0]
    assert job.id == "a2"
    # cancelled while pending: out of its group's list
    mq.cancel("q", "a3")
    mq.cancel("q", "a1")
    mq.complete(job, 1)
    assert mq.client.hget(mq.keys.queue("q").groups_active, "a") is None
    assert list(mq.claim("q", 1)) == []
    assert mq.counts("q")["pending"] == 0


def test_a_delayed_grouped_job_joins_its_group_when_due(redis_client) -> None:
    now = [1_000_000]
    mq = EchoMQ(redis_client, clock=lambda: now[0])
    mq.enqueue("q", "n", job_id="later", group="a", delay_ms=1000)
    mq.enqueue("q", "n", job_id="b0", group="b")
    assert ids_of(mq.claim("q", 5)) == ["b0"]
    now[0] += 1000
    mq.timers.promote_delayed("q")
    assert mq.client.llen(mq.keys.queue("q").group("a", "pending")) == 1
    assert ids_of(mq.claim("q", 5)) == ["later"]


def test_enqueue_many_and_flow_nodes_take_a_group(redis_client) -> None:
    mq = EchoMQ(redis_client)
    mq.enqueue_many(
        "q", [{"name": "n", "payload": i, "job_id": f"m{i}", "group": "m"} for i in range(2)]
    )
    mq.enqueue_many("q", [("n", 1, {"job_id": "o0", "group": "o"})])
    mq.add_flow(Flow("q", "n", job_id="root", children=[Flow("q", "n", job_id="leaf", group="f")]))
    assert ids_of(mq.claim("q", 5)) == ["m0", "o0", "leaf", "m1"]


def test_a_canvas_signature_takes_a_group(redis_client) -> None:
    mq = EchoMQ(redis_client)
    for i in range(2):
        mq.enqueue("q", "n", job_id=f"big{i}", group="big")
    task("t.echo", queue="q").set(job_id="sig", group="small").enqueue(mq=mq)
    assert mq.client.hget(mq.keys.job("q", "sig"), "group") == b"small"
    assert ids_of(mq.claim("q", 3)) == ["big0", "sig", "big1"]


@pytest.mark.parametrize("bad", ["a{b", "a}b", "a:b", "x" * 129, "", "a b", 7])
def test_a_bad_group_is_refused_before_any_write(redis_client, bad) -> None:
    mq = EchoMQ(redis_client)
    with pytest.raises(ValueError, match="invalid group name") as err:
        mq.enqueue("q", "n", job_id="j", group=bad)
    assert GROUP_RULE in str(err.value)
    with pytest.raises(ValueError, match="invalid group name"):
        mq.enqueue_many("q", [("n", 1, {"group": bad})])
    with pytest.raises(ValueError, match="invalid group name"):
        mq.add_flow(Flow("q", "n", job_id="f", group=bad))
    with pytest.raises(ValueError, match="invalid group name"):
        mq.groups.pause("q", bad)
    assert all_keys(mq, mq.keys.queue("q").base + "*") == []


def test_a_queue_without_groups_writes_no_group_key(redis_client) -> None:
    mq = EchoMQ(redis_client)
    mq.enqueue("q", "n", job_id="j0")
    mq.enqueue("q", "n", job_id="j1", priority=3)
    for job in mq.claim("q", 2):
        mq.complete(job, 1)
    assert group_keys(mq) == []
    assert "group" not in {k.decode() for k in mq.client.hkeys(mq.keys.job("q", "j0"))}


def test_group_counts_in_stats(redis_client) -> None:
    mq = EchoMQ(redis_client, queues=CAPPED)
    for i in range(3):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    mq.enqueue("q", "n", job_id="b0", group="b")
    mq.claim("q", 5)
    mq.groups.pause("q", "b")
    assert mq.groups.counts("q") == {
        "a": {"pending": 2, "active": 1, "paused": False, "concurrency": 1},
        "b": {"pending": 0, "active": 1, "paused": True, "concurrency": 1},
    }
    assert (mq.counts("q")["pending"], mq.counts("q")["active"]) == (2, 2)
    assert mq.job_ids("q", "pending") == ["a1", "a2"]  # each group's, by name
    doc = collect(mq, ["q"])
    assert doc["queues"]["q"]["groups"]["a"] == {
        "pending": 2,
        "active": 1,
        "paused": False,
        "concurrency": 1,
    }
    text = render(doc)
    assert "groups: 2" in text and "paused" in text
    plain = EchoMQ(redis_client)
    plain.enqueue("p", "n", job_id="j")
    assert collect(plain, ["p"])["queues"]["p"]["groups"] == {}


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_group_concurrency_setting_is_checked(bad) -> None:
    found = problems({"QUEUES": {"q": {"GROUP_CONCURRENCY": bad}}})
    assert [p[0] for p in found] == ["echomq_django.E080"]
    assert "GROUP_CONCURRENCY" in found[0][1]
    assert problems({"QUEUES": {"q": {"GROUP_CONCURRENCY": 5}}}) == []


# -- GROUP_RATE_LIMIT ------------------------------------------------------------


def test_a_groups_rate_window_holds_it_out_until_it_opens(redis_client) -> None:
    now = [1_000_000]
    queues = {"q": {"GROUP_RATE_LIMIT": {"MAX": 2, "PER_MS": 1000}}}
    mq = EchoMQ(redis_client, queues=queues, clock=lambda: now[0])
    for i in range(4):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    mq.enqueue("q", "n", job_id="b0", group="b")
    assert ids_of(mq.claim("q", 10)) == ["a0", "b0", "a1"]
    # the window is full: out of the ring, its opening announced as 'd'
    k = mq.keys.queue("q")
    assert mq.client.zscore(k.groups_limited, "a") == 1_001_000
    assert mq.client.zscore(k.wake, "d") == 1_001_000
    assert list(mq.claim("q", 10)) == []
    assert mq.client.zscore(k.wake, "0") is None  # idle workers block
    now[0] += 1000
    assert mq.timers.promote_delayed("q") == 0  # no delayed job, but the group is back
    assert mq.client.zscore(k.wake, "0") == 0
    assert ids_of(mq.claim("q", 10)) == ["a2", "a3"]
    # a window that closed expires with its key
    assert mq.client.pttl(k.group("a", "limiter")) > 0


def test_a_group_rate_set_at_run_time_wins(redis_client) -> None:
    mq = EchoMQ(redis_client)
    for i in range(3):
        mq.enqueue("q", "n", job_id=f"a{i}", group="a")
    mq.groups.set_rate_limit("q", "a", {"MAX": 1, "PER_MS": 60_000})
    assert ids_of(mq.claim("q", 10)) == ["a0"]
    mq.groups.set_rate_limit("q", "a", None)
    assert ids_of(mq.claim("q", 10)) == ["a1", "a2"]
    with pytest.raises(ValueError, match="a group rate limit is"):
        mq.groups.set_rate_limit("q", "a", {"MAX": 0, "PER_MS": 1000})
    with pytest.raises(ValueError, match="whole numbers from 1 to 315360000000, got"):
        mq.groups.set_rate_limit("q", "a", {"MAX": 1, "PER_MS": 10**30})


@pytest.mark.parametrize(
    "bad",
    [
        {"MAX": 0, "PER_MS": 1000},
        {"MAX": 1},
        {"MAX": 1, "PER_MS": 1.5},
        5,
        {"MAX": True, "PER_MS": 1},
        {"MAX": 1, "PER_MS": 10**19},  # past what the claim script reads: every claim failed
        {"MAX": 2**63, "PER_MS": 1000},
    ],
)
def test_group_rate_limit_setting_is_checked(bad) -> None:
    found = problems({"QUEUES": {"q": {"GROUP_RATE_LIMIT": bad}}})
    assert [p[0] for p in found] == ["echomq_django.E081"]
    assert problems({"QUEUES": {"q": {"GROUP_RATE_LIMIT": {"MAX": 5, "PER_MS": 100}}}}) == []


def test_real_workers_wait_out_a_groups_window_and_go_on(redis_client) -> None:
    """Two workers, one group allowed one start per 300 ms: its jobs start a
    window apart (the 'd' marker wakes a worker when it opens), while the
    other group's jobs run at once."""
    queues = {"q": {}}
    mq = EchoMQ(redis_client, queues=queues)
    mq.groups.set_rate_limit("q", "slow", {"MAX": 1, "PER_MS": 300})  # "fast" has none
    for i in range(3):
        mq.enqueue("q", "t.echo", i, job_id=f"slow{i}", group="slow")
        mq.enqueue("q", "t.echo", i, job_id=f"fast{i}", group="fast")
    running = [
        Background(Worker(["q"], concurrency=2, mq=EchoMQ(redis_client, queues=queues)))
        for _ in range(2)
    ]
    try:
        wait_for(lambda: mq.counts("q")["completed"] == 6, what="6 jobs")
    finally:
        for bg in running:
            bg.worker.stop()
        for bg in running:
            bg.join()
    starts = {
        j: int(mq.client.hget(mq.keys.job("q", j), "started_at"))
        for j in [f"{g}{i}" for g in ("slow", "fast") for i in range(3)]
    }
    slow = sorted(starts[f"slow{i}"] for i in range(3))
    assert slow[1] - slow[0] >= 300 and slow[2] - slow[1] >= 300
    assert max(starts[f"fast{i}"] for i in range(3)) < slow[1]


def test_group_limit_errors_name_the_group_setting_and_the_unknown_key(mq) -> None:
    with pytest.raises(ValueError) as err:
        mq.groups.set_concurrency("q", "customer-3", 0)
    assert str(err.value) == (
        "concurrency must be a whole number of jobs from 1 to 1000000, got 0 "
        "(None drops the group's cap: the queue's GROUP_CONCURRENCY applies)"
    )
    with pytest.raises(ValueError, match=r"\(unknown key X\)$"):
        mq.groups.set_rate_limit("q", "customer-3", {"MAX": 5, "PER_MS": 1000, "X": 1})
