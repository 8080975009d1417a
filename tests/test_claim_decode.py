"""A claim's Jobs are decoded without a Job.__init__ per job and with the
payloads in one call (docs/explanation/performance.md#the-workers-python):
each must equal what ``Job.decode`` reads from the same row."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.core.claims import _json_many, claimed_jobs
from echomq_django.core.jobs import Job, Policy
from tests.support.jobkit import command_calls


def expected(mq: EchoMQ, job: Job) -> Job:
    """The claimed job as ``Job.decode`` reads it from its row now (a claim's
    Job carries neither ``started_at`` nor ``first_started_at``)."""
    row = {k.decode(): v for k, v in mq.client.hgetall(mq.keys.job(job.queue, job.id)).items()}
    got = Job.decode(job.queue, job.id, row, mq, JobState.ACTIVE, job.lease_deadline)
    got.started_at = got.first_started_at = None
    return got


def test_every_shape_of_row_decodes_as_job_decode_reads_it(redis_client) -> None:
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"MAX_ATTEMPTS": 4, "BACKOFF_MS": 9}})
    mq.enqueue("q", "plain", {"a": [1, "x"]}, job_id="j1")
    mq.enqueue("q", "own", "text", job_id="j2", max_attempts=2, backoff_ms=0, timeout_ms=700)
    mq.enqueue("q", "null", None, job_id="j3", priority=-5)
    mq.add_flow(
        Flow(
            "q",
            "root",
            7,
            job_id="p",
            children=[
                Flow("q", "kid", [], job_id="c1"),
                Flow("q", "kid", {}, job_id="c2", ignore_dependency_on_failure=True),
                Flow("other", "far", {"n": 1}, job_id="c3", remove_dependency_on_failure=True),
            ],
        )
    )
    jobs = mq.claim("q", 10, lease_ms=5000) + mq.claim("other", 10, lease_ms=5000)
    assert sorted(j.id for j in jobs) == ["c1", "c2", "c3", "j1", "j2", "j3"]
    for job in jobs:
        assert job == expected(mq, job), job.id
    by_id = {j.id: j for j in jobs}
    assert (by_id["j1"].payload, by_id["j1"].max_attempts, by_id["j1"].backoff_ms) == (
        {"a": [1, "x"]},
        4,
        9,
    )
    assert (by_id["j2"].max_attempts, by_id["j2"].backoff_ms, by_id["j2"].timeout_ms) == (
        2,
        0,
        700,
    )
    assert (by_id["j3"].payload, by_id["j3"].priority, by_id["j3"].parent_policy) == (
        None,
        -5,
        None,
    )
    assert [
        (by_id[c].parent, by_id[c].parent_queue, by_id[c].parent_policy) for c in ("c1", "c2", "c3")
    ] == [("p", "q", Policy.FAIL_PARENT), ("p", "q", Policy.IGNORE), ("p", "q", Policy.REMOVE)]
    job = by_id["c1"]
    assert (job.state, job.attempts, job.stalls, job.result, job.error) == (
        "active",
        1,
        0,
        None,
        None,
    )
    assert (job.timed_out, job.cancelled, job.started_at) == (False, False, None)
    assert job.dependencies is not None and mq.complete(job, 1).released == []


def test_a_claimed_job_is_its_own_object() -> None:
    flat = [
        "a",
        "t",
        "n",
        "[1]",
        "1",
        False,
        False,
        False,
        False,
        False,
        "5",
        False,
        False,
        False,
        False,
    ]
    one, two = claimed_jobs("q", flat * 2, 9, None)
    one.payload.append(2)
    one.timed_out = True
    assert (two.payload, two.timed_out, Job("x", "q", "n").timed_out) == ([1], False, False)
    assert one._cache is not two._cache


def test_payloads_decode_in_one_call_or_one_by_one_when_they_do_not_split() -> None:
    assert _json_many(['{"a":1}', False, None, '"x"', "[]"]) == [{"a": 1}, None, None, "x", []]
    assert _json_many([]) == []
    with pytest.raises(ValueError):
        _json_many(["1,2", "3"])  # two values in one text: never split across jobs
    with pytest.raises(ValueError):
        _json_many(["[1", "2]"])


def test_a_row_of_common_fields_only_is_read_by_one_hmget_and_its_field_count(
    redis_client,
) -> None:
    """lua/claim.lua ``claim_read`` (docs/explanation/performance.md#fields-a-row-does-not-hold):
    a flow's leaf costs one ``HMGET`` and one ``HLEN``; a job of ``enqueue()`` one ``HEXISTS``
    more (its replay token); a row with any other field (here a time limit) is read whole by a
    second ``HMGET`` and reports it. Each decodes as ``Job.decode`` reads its row."""
    mq = EchoMQ(redis_client, prefix="emq")
    mq.enqueue("q", "plain", 1, job_id="a")
    mq.add_flow(Flow("q", "root", 0, job_id="p", children=[Flow("q", "kid", 2, job_id="k")]))
    mq.enqueue("q", "timed", 3, job_id="t", timeout_ms=700)
    names = ("hmget", "hlen", "hexists")
    before = [command_calls(redis_client, name) for name in names]
    jobs = {job.id: job for job in mq.claim("q", 3, lease_ms=5000)}
    calls = [command_calls(redis_client, name) - n for name, n in zip(names, before, strict=True)]
    assert sorted(jobs) == ["a", "k", "t"]
    assert calls == [4, 3, 1]  # a: its token asked (HEXISTS); t: two fields more, read whole
    assert [(jobs[i].timeout_ms, jobs[i].parent, jobs[i].payload) for i in "akt"] == [
        (None, None, 1),
        (None, "p", 2),
        (700, None, 3),
    ]
    for job in jobs.values():
        assert job == expected(mq, job), job.id


# options a job may be added with, each writing fields of its own onto its row
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "max_attempts": st.integers(1, 5),
        "backoff_ms": st.integers(0, 900),
        "priority": st.integers(-3, 3),
        "timeout_ms": st.integers(100, 9000),
        "dedup_key": st.sampled_from(["d1", "d2"]),
        "keep": st.integers(0, 60),
        "group": st.sampled_from(["g1", "g2"]),
        "expires_ms": st.integers(60_000, 90_000),
        "backoff": st.just("fixed"),
        "on_success": st.just("t.echo"),
    },
)
JOBS = st.lists(
    st.tuples(st.sampled_from(["enqueue", "many", "leaf", "cross"]), OPTIONS),
    min_size=1,
    max_size=6,
)
PREFIXES = itertools.count()  # a fresh key prefix for each example


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(jobs=JOBS)
def test_claims_of_random_rows_decode_as_their_rows_read(redis_client, jobs) -> None:
    """lua/claim.lua ``claim_read``: whatever options a job was added with and by whichever
    path (``enqueue``'s replay token, ``enqueue_many``, a flow's leaf on its parent's queue or
    another), a claim reports each field as the row holds it: the one-read path for rows of
    common fields and the whole read for the rest agree with ``Job.decode``."""
    mq = EchoMQ(redis_client, prefix=f"cd{next(PREFIXES)}")
    ids, kids = set(), []
    for n, (how, options) in enumerate(jobs):
        if how == "enqueue":  # a dedup key taken answers the earlier job's id
            ids.add(mq.enqueue("q", "t.echo", {"n": n}, job_id=f"j{n}", **options))
        elif how == "many":  # no options: enqueue_many's rows
            ids.update(mq.enqueue_many("q", [("t.echo", n)]))
        else:  # a leaf, on its parent's queue or another (a flow's dedup keys aside)
            options.pop("dedup_key", None)
            kids.append(Flow("k" if how == "cross" else "q", "t.echo", n, job_id=f"j{n}"))
            for key, value in options.items():
                setattr(kids[-1], key, value)
            ids.add(f"j{n}")
    if kids:
        mq.add_flow(Flow("q", "root", 0, job_id="p", children=kids))
    claimed = []
    for queue in ("q", "k"):
        while batch := mq.claim(queue, 10, lease_ms=60_000):
            claimed += batch
    assert sorted(j.id for j in claimed) == sorted(ids), jobs
    for job in claimed:
        assert job == expected(mq, job), (job.id, jobs)
