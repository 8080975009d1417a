"""A completing job's pending progress and log writes ride its own
``complete`` call (lua/complete.lua's ARGV[5], runners/flusher.py ``Ride``;
docs/howto/progress-and-logs.md#when-a-write-is-visible): one script writes
them and then completes the job, so the values read after completion, the
events' order and the refusal under a lost lease are those of a
``write_reports`` call sent ahead; on both rigs."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, JobState, LeaseLost, PayloadError, RedisUnavailable
from echomq_django.core.exceptions import JobCancelled
from echomq_django.runners.flusher import Flusher
from tests.test_progress import (
    LINE_BATCHES,
    as_lines,
    assert_log_is_the_oracle,
    claimed,
    oracle_write,
)
from tests.test_progress_writes import counted, events_by_job


def ends(mq, job_id: str) -> list[str]:
    """``job_id``'s events other than added and active, in order."""
    return [k for k in events_by_job(mq)[job_id] if k not in ("added", "active")]


def complete_riding(mq, writes, job, result) -> list:
    """``complete_many`` of ``job`` with ``result``, its writes riding the
    call as the reporter sends them (``writes.riding``); its replies."""
    with writes.riding([job]) as ride:
        replies = mq.complete_many([(job, result)], ride.ahead, ride.carry)
        ride.settle([job], replies)
    return replies


def writing(mq, progress, line: str | None = None):
    """Job ``a``, claimed, with its own flusher ``writes`` holding its
    progress ``progress`` and, when given, the log line ``line``."""
    a = claimed(mq, job_id="a")
    writes = Flusher(mq)
    a._writes = writes
    a.report_progress(progress)
    if line is not None:
        a.log(line)
    return a, writes


def test_complete_writes_the_carried_writes_before_the_completion(mq) -> None:
    a, b = claimed(mq, job_id="a"), claimed(mq, job_id="b")
    carry = {id(a): (a, ["30", "70"], ["one", "two"]), id(b): (b, ["90"], [])}
    outcomes = mq.complete_many([(a, "done"), (b, "done")], None, carry)
    assert [o.state for o in outcomes] == [JobState.COMPLETED, JobState.COMPLETED]
    assert carry == {}  # each popped by the call that carried it
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (70, ["one", "two"])
    assert (mq.get_job("q", "b").progress, mq.job_logs("q", "b")) == (90, [])
    assert ends(mq, "a") == ["progress", "progress", "completed"]
    assert ends(mq, "b") == ["progress", "completed"]


def test_carried_lines_keep_the_log_s_bound_and_its_oldest_line_in_the_row(redis_client) -> None:
    # KEEP_LOGS 2: a's log held one line; three more ride its completion, b's
    # only line rides b's, c's line rides the completion of c, cancelled meanwhile
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": 2}})
    a, b, c = (claimed(mq, job_id=i) for i in "abc")
    a.log("first")
    mq.cancel("q", "c")
    carry = {id(a): (a, [], ["2", "3", "4"]), id(b): (b, [], ["only"]), id(c): (c, [], ["last"])}
    outcomes = mq.complete_many([(a, 1), (b, 1), (c, 1)], None, carry)
    assert [getattr(o, "state", type(o)) for o in outcomes] == [
        JobState.COMPLETED,
        JobState.COMPLETED,
        JobCancelled,
    ]
    row = lambda i: mq.client.hmget(mq.keys.job("q", i), "s", "lg")  # noqa: E731
    logs = lambda i: mq.client.lrange(mq.keys.job_keys("q", i).logs, 0, -1)  # noqa: E731
    assert (row("a"), logs("a"), mq.job_logs("q", "a")) == (
        [b"completed", b"3"],
        [b"4"],
        ["3", "4"],
    )
    assert (row("b"), logs("b"), mq.job_logs("q", "b")) == ([b"completed", b"only"], [], ["only"])
    assert (row("c"), logs("c"), mq.job_logs("q", "c")) == ([b"dead", b"last"], [], ["last"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keep=st.integers(1, 4), before=LINE_BATCHES, carried=LINE_BATCHES, twice=st.booleans())
def test_carried_lines_read_as_one_list_that_got_the_same_lines(
    redis_client, keep, before, carried, twice
) -> None:
    """Lines riding a job's completion (after lines written alone, the job
    listed once or twice in the batch) leave its log as one Redis list
    that got the same lines would be, in the layout the protocol names;
    the call sent again writes nothing more."""
    redis_client.flushall()
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": keep}})
    a = claimed(mq)
    for lines in as_lines(before, "w"):
        mq.progress.write_many([(a, [], lines)])
        oracle_write(redis_client, lines, keep)
    lines = [line for batch in as_lines(carried, "c") for line in batch]
    pairs = [(a, 1), (a, 1)] if twice else [(a, 1)]
    assert mq.complete_many(pairs, None, {id(a): (a, ["5"], lines)})[0].state is JobState.COMPLETED
    if lines:
        oracle_write(redis_client, lines, keep)
    assert_log_is_the_oracle(mq)
    mq.complete_many([(a, 1)], None, {id(a): (a, ["5"], lines)})  # its reply lost: sent again
    assert_log_is_the_oracle(mq)


def test_a_batch_whose_first_completion_moves_its_parent_reads_the_next_row_again(mq) -> None:
    # c1's completion writes its parent's keys: c2's row, read for its writes'
    # lease check, is read again for its completion; both land, and p is released
    mq.add_flow(
        Flow("q", "p", job_id="p", children=[Flow("q", "c", job_id=f"c{i}") for i in (1, 2)])
    )
    c1, c2 = sorted(mq.claim("q", 2, lease_ms=60_000), key=lambda j: j.id)
    carry = {id(c1): (c1, ["10"], ["c1 ran"]), id(c2): (c2, ["20"], ["c2 ran"])}
    outcomes = mq.complete_many([(c1, 1), (c2, 2)], None, carry)
    assert [o.state for o in outcomes] == [JobState.COMPLETED, JobState.COMPLETED]
    for job_id, value in (("c1", 10), ("c2", 20)):
        job = mq.get_job("q", job_id)
        assert (job.state, job.progress, mq.job_logs("q", job_id)) == (
            JobState.COMPLETED,
            value,
            [f"{job_id} ran"],
        )
        assert ends(mq, job_id) == ["progress", "completed"]
    assert mq.get_job("q", "p").state == JobState.PENDING


def test_a_ride_carries_the_completing_jobs_writes_and_sends_the_rest_ahead(mq) -> None:
    a, b = claimed(mq, job_id="a"), claimed(mq, job_id="b")
    writes = Flusher(mq)
    a._writes = b._writes = writes
    a.report_progress(40)
    b.report_progress(20)
    a.log("a's last line")
    b.log("b runs on")
    with writes.riding([a]) as ride:
        assert list(ride.carry) == [id(a)]
        assert len(ride.ahead) == 1  # b's write_reports call
        replies = mq.complete_many([(a, "done")], ride.ahead, ride.carry)
        ride.settle([a], replies)
    assert ride.carry == {}
    assert counted(writes) == {"sent": 4, "dropped": 0}
    assert writes.stats["sends"] == 0  # all rode the completion's round trip
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (40, ["a's last line"])
    assert (mq.get_job("q", "b").state, mq.get_job("q", "b").progress) == (JobState.ACTIVE, 20)
    assert mq.job_logs("q", "b") == ["b runs on"]
    assert ends(mq, "a") == ["progress", "completed"]


def test_a_refused_completion_refuses_its_carried_writes(mq) -> None:
    a, writes = writing(mq, 60, "under a lease lost meanwhile")
    mq.client.hset(mq.keys.job("q", "a"), "lease", "taken")  # another worker's lease now
    replies = complete_riding(mq, writes, a, "done")
    assert type(replies[0]) is LeaseLost
    assert counted(writes) == {"sent": 0, "dropped": 2}
    job = mq.get_job("q", "a")
    assert (job.state, job.progress, mq.job_logs("q", "a")) == (JobState.ACTIVE, None, [])
    assert ends(mq, "a") == []
    with pytest.raises(LeaseLost):
        a.log("and the next call raises")


def test_a_job_cancelled_while_it_ran_keeps_its_carried_writes(mq) -> None:
    a, writes = writing(mq, 80, "before the cancel")
    mq.cancel("q", "a")
    replies = complete_riding(mq, writes, a, "done")
    assert type(replies[0]) is JobCancelled
    assert counted(writes) == {"sent": 2, "dropped": 0}
    job = mq.get_job("q", "a")
    assert (job.state, job.error) == (JobState.DEAD, "cancelled")
    assert (job.progress, mq.job_logs("q", "a")) == (80, ["before the cancel"])
    assert ends(mq, "a") == ["cancelling", "progress", "dead"]


def test_a_result_that_does_not_encode_has_its_writes_sent_alone(mq) -> None:
    a, writes = writing(mq, 10)
    replies = complete_riding(mq, writes, a, object())
    assert type(replies[0]) is PayloadError
    assert (counted(writes), writes.stats["sends"]) == ({"sent": 1, "dropped": 0}, 1)
    assert (mq.get_job("q", "a").state, mq.get_job("q", "a").progress) == (JobState.ACTIVE, 10)


def test_an_outage_at_the_completion_keeps_its_carried_writes(mq, redis_client) -> None:
    # every master of a Cluster, or the one server
    where = (
        {"target_nodes": RedisCluster.PRIMARIES} if isinstance(redis_client, RedisCluster) else {}
    )
    a, writes = writing(mq, 50, "kept")
    redis_client.config_set(
        "maxmemory", 1, **where
    )  # noeviction: the script's first write is refused
    try:
        with pytest.raises(RedisUnavailable, match="OutOfMemoryError"), writes.riding([a]) as ride:
            mq.complete_many([(a, "done")], ride.ahead, ride.carry)
    finally:
        redis_client.config_set("maxmemory", 0, **where)
    assert (writes.pending(), counted(writes)) == (2, {"sent": 0, "dropped": 0})
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (None, [])
    replies = complete_riding(
        mq, writes, a, "done"
    )  # the reporter sends the job again: they ride it
    assert replies[0].state is JobState.COMPLETED
    assert counted(writes) == {"sent": 2, "dropped": 0}
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (50, ["kept"])
    assert ends(mq, "a") == ["progress", "completed"]


def test_a_completion_that_errs_puts_its_writes_back_and_its_replay_lands_them_once(mq) -> None:
    a, writes = writing(mq, 50, "once")
    completed = mq.keys.queue("q").completed
    mq.client.set(completed, "not a zset")  # the completion's ZADD errs, after the writes
    replies = complete_riding(mq, writes, a, "done")
    assert isinstance(replies[0], redis.ResponseError) and "WRONGTYPE" in str(replies[0])
    assert (writes.pending(), counted(writes)) == (2, {"sent": 0, "dropped": 0})
    mq.client.delete(completed)
    replies = complete_riding(mq, writes, a, "done")  # sent again: the script answers its replay, 0
    assert replies[0].state is JobState.COMPLETED
    assert counted(writes) == {"sent": 2, "dropped": 0}
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (50, ["once"])
