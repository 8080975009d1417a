"""Progress and job logs (docs/howto/progress-and-logs.md,
docs/explanation/protocol.md#progress-and-log-lines): a running job's
writes under its lease, read back, bounded, removed with the job, and bad
input refused before any write, on both rigs."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echomq_django import (
    EchoMQ,
    JobNotActive,
    JobNotFound,
    JobRef,
    JobState,
    LeaseLost,
    PayloadError,
    current_job,
    handler,
)
from echomq_django.core.live import CUT_MARKER, MAX_LOG_LINE_BYTES, MAX_PROGRESS_BYTES
from echomq_django.protocol.live.events import split_values
from tests.support.jobkit import keys_of
from tests.support.workerkit import burst


@handler("prog.steps")
def steps(job):
    for n in (25, 50, 100):
        job.report_progress(n)
        job.log(f"step {n}")
    job.report_progress({"done": 3, "of": 3})
    assert current_job() is None  # a plain handler has its Job; the context is for tasks
    return "ok"


@handler("prog.async")
async def async_steps(job):
    await job.areport_progress(40)
    assert await job.alog("half way") is None  # in a worker: no round trip, nothing to tell
    return "ok"


def claimed(mq, queue="q", job_id="a"):
    mq.enqueue(queue, "prog.steps", None, job_id=job_id)
    (job,) = mq.claim(queue)
    return job


def progress_events(mq, queue="q") -> list[dict]:
    """The raw ``progress`` entries of ``queue``'s events stream, in order,
    one dict per value: a batched entry (``ps``) counts once per id."""
    entries = mq.client.xrange(mq.keys.queue(queue).events)
    out = []
    for _id, fields in entries:
        f = {k.decode(): v.decode() for k, v in fields.items()}
        if f["e"] == "progress" and "ps" in f:
            ids = f["id"].split(" ")
            out += [
                {"e": "progress", "id": i, "p": v}
                for i, v in zip(ids, split_values(f["ps"]), strict=True)
            ]
        elif f["e"] == "progress":
            out.append(f)
    return out


def test_a_worker_run_handler_reports_progress_and_logs(mq) -> None:
    mq.enqueue("q", "prog.steps", None, job_id="a")
    burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "a")
    assert (job.state, job.result) == (JobState.COMPLETED, "ok")
    assert job.progress == {"done": 3, "of": 3}
    assert mq.job_logs("q", "a") == ["step 25", "step 50", "step 100"]
    assert mq.job_logs(JobRef("q", "a"), start=1) == ["step 50", "step 100"]
    assert mq.job_logs("q/a", None, -1, -1) == ["step 100"]
    assert job.logs(0, 0) == ["step 25"]
    assert [e["p"] for e in progress_events(mq)] == ["25", "50", "100", '{"done":3,"of":3}']
    assert {e["id"] for e in progress_events(mq)} == {"a"}


def test_an_async_handler_reports_through_the_same_job(mq) -> None:
    mq.enqueue("q", "prog.async", None, job_id="b")
    burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "b")
    assert (job.state, job.progress, mq.job_logs("q", "b")) == (
        JobState.COMPLETED,
        40,
        ["half way"],
    )


def test_progress_is_kept_on_the_job_object_and_through_a_retry(mq) -> None:
    job = claimed(mq)
    job.report_progress(12.5)
    assert job.progress == 12.5
    mq.fail(job, "boom")  # delayed (backoff): the row keeps the last value
    assert mq.get_job("q", "a").progress == 12.5


def test_a_stale_lease_or_a_finished_job_writes_nothing(mq) -> None:
    job = claimed(mq)
    job.report_progress(10)
    job.log("one")
    stale = mq.get_job("q", "a")
    stale.lease = "not-the-lease"
    with pytest.raises(LeaseLost):
        stale.report_progress(90)
    with pytest.raises(LeaseLost):
        stale.log("two")
    mq.complete(job, 1)
    with pytest.raises(JobNotActive, match="is completed"):
        job.report_progress(95)
    with pytest.raises(JobNotActive):
        job.log("late")
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (10, ["one"])
    assert [e["p"] for e in progress_events(mq)] == ["10"]


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (-1, "a number from 0 to 100"),
        (100.5, "a number from 0 to 100"),
        (float("nan"), "a number from 0 to 100"),
        (10**400, "a number from 0 to 100"),  # no float holds it: not an OverflowError
        (True, "a number from 0 to 100"),
        ("50%", "a number from 0 to 100"),
        ([1, 2], "a number from 0 to 100"),
        ({"f": object()}, "not JSON-serialisable"),
        ({"x": "y" * MAX_PROGRESS_BYTES}, f"of at most {MAX_PROGRESS_BYTES} bytes"),
    ],
)
def test_bad_progress_is_refused_before_any_write(mq, value, rule) -> None:
    job = claimed(mq)
    before = mq.client.xlen(mq.keys.queue("q").events)
    with pytest.raises(PayloadError, match=rule):
        job.report_progress(value)
    assert mq.get_job("q", "a").progress is None
    assert mq.client.xlen(mq.keys.queue("q").events) == before


def test_a_long_log_line_is_cut_with_a_marker_and_a_bad_one_refused(mq) -> None:
    job = claimed(mq)
    line = "é" * MAX_LOG_LINE_BYTES  # 2 bytes each: twice the limit
    job.log(line)
    (kept,) = mq.job_logs("q", "a")
    head = kept[: kept.index(" [...")]
    assert head == "é" * len(head)  # cut on a character boundary, not inside one
    assert kept == head + CUT_MARKER.format(n=len(line.encode()) - len(head.encode()))
    assert MAX_LOG_LINE_BYTES - 1 <= len(kept.encode()) <= MAX_LOG_LINE_BYTES
    with pytest.raises(TypeError, match="a job log line is a str"):
        job.log(b"bytes")
    with pytest.raises(ValueError, match="must encode as UTF-8"):
        job.log("\ud800")
    assert len(mq.job_logs("q", "a")) == 1


def test_the_log_keeps_the_queue_s_keep_logs_lines(redis_client) -> None:
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": 3}})
    job = claimed(mq)
    for i in range(3):
        job.log(f"line {i}")
    held = mq.progress.write_many([(job, [], ["line 3", "line 4"])])
    assert held == [5]  # before the trim: one script adds both lines, then trims
    assert mq.job_logs("q", "a") == ["line 2", "line 3", "line 4"]
    keys = mq.keys.job_keys("q", "a")  # the oldest line in the row, the others a list
    assert mq.client.hget(keys.row, "lg") == b"line 2"
    assert mq.client.lrange(keys.logs, 0, -1) == [b"line 3", b"line 4"]


def test_a_log_of_one_line_is_a_field_of_the_row(redis_client) -> None:
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": 1}})
    job = claimed(mq)
    keys = mq.keys.job_keys("q", "a")
    job.log("first")
    assert (mq.client.hget(keys.row, "lg"), mq.client.exists(keys.logs)) == (b"first", 0)
    assert mq.progress.write_many([(job, [], ["second", "third"])]) == [3]
    # KEEP_LOGS 1: the newest line moves to the row and the list goes
    assert (mq.client.hget(keys.row, "lg"), mq.client.exists(keys.logs)) == (b"third", 0)
    assert mq.job_logs("q", "a") == ["third"]
    assert (mq.job_logs("q", "a", 1), mq.job_logs("q", "a", -5, 0)) == ([], ["third"])


# a write's lines: each line unique, some longer than the 64 bytes a row keeps
LINE_BATCHES = st.lists(st.lists(st.booleans(), min_size=1, max_size=4), max_size=6)
# LRANGE's indexes: around a short log's ends, and the extremes job_logs takes
INDEXES = st.one_of(st.integers(-9, 9), st.sampled_from([2**63 - 1, -(2**63) + 1, 2**53, -(2**53)]))


def as_lines(batches: list[list[bool]], tag: str = "") -> list[list[str]]:
    """Unique lines for ``LINE_BATCHES``: True draws one of 70 bytes."""
    count = iter(range(10_000))
    return [[f"{tag}{next(count)}" + ("x" * 70 if long else "") for long in b] for b in batches]


def oracle_write(client, lines: list[str], keep: int) -> int:
    """The job log as one Redis list would hold it: RPUSH, then LTRIM to
    the newest ``keep``; returns RPUSH's reply."""
    held = client.rpush("oracle", *lines)
    client.ltrim("oracle", -keep, -1)
    return held


def assert_log_is_the_oracle(mq, job_id: str = "a") -> None:
    """``job_id``'s log reads as the oracle list, and is laid out as the
    protocol says: a short oldest line in the row's ``lg``, the rest in
    the list; a long one (over 64 bytes) leaves the whole log in the list,
    and the row stays a listpack."""
    client, keys = mq.client, mq.keys.job_keys("q", job_id)
    want = [line.decode() for line in client.lrange("oracle", 0, -1)]
    assert mq.job_logs("q", job_id) == want
    row, listed = client.hget(keys.row, "lg"), client.lrange(keys.logs, 0, -1)
    if want and len(want[0]) <= 64:
        assert (row, listed) == (want[0].encode(), [w.encode() for w in want[1:]])
    else:
        assert (row, listed) == (None, [w.encode() for w in want])
    assert client.object("encoding", keys.row) == b"listpack"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keep=st.integers(1, 5),
    batches=LINE_BATCHES,
    ranges=st.lists(st.tuples(INDEXES, INDEXES), min_size=1, max_size=6),
)
def test_job_logs_reads_as_lrange_reads_the_same_lines_in_one_list(
    redis_client, keep, batches, ranges
) -> None:
    """The log in two parts (the row's oldest line when short, a list of
    the rest) answers every range as Redis' own LRANGE answers for one list
    that got the same lines, RPUSHed and LTRIMmed to the newest ``keep``;
    the held counts are its RPUSH replies."""
    redis_client.flushall()
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": keep}})
    job = claimed(mq)
    for lines in as_lines(batches):
        held = mq.progress.write_many([(job, [], lines)])
        assert held == [oracle_write(redis_client, lines, keep)]
        assert_log_is_the_oracle(mq)
    for start, end in ranges:
        want = [line.decode() for line in redis_client.lrange("oracle", start, end)]
        assert mq.job_logs("q", "a", start, end) == want


def test_a_log_kept_in_the_list_alone_reads_and_grows_in_order(redis_client) -> None:
    # a log whose oldest line is the list's (as every log before the row kept
    # one): job_logs reads it, and later lines follow it, kept to KEEP_LOGS
    mq = EchoMQ(redis_client, prefix="emq", queues={"q": {"KEEP_LOGS": 3}})
    job = claimed(mq)
    mq.client.rpush(mq.keys.job_keys("q", "a").logs, "old 1", "old 2")
    assert mq.job_logs("q", "a") == ["old 1", "old 2"]
    job.log("new")
    assert mq.job_logs("q", "a") == ["old 1", "old 2", "new"]
    assert mq.progress.write_many([(job, [], ["newer"])]) == [4]
    assert mq.job_logs("q", "a") == ["old 2", "new", "newer"]
    assert mq.client.hget(mq.keys.job("q", "a"), "lg") == b"old 2"


def test_the_default_keeps_a_hundred_lines(mq) -> None:
    job = claimed(mq)
    for i in range(105):
        job.log(str(i))
    assert mq.job_logs("q", "a") == [str(i) for i in range(5, 105)]


def test_the_log_goes_with_its_job_on_remove_and_retention(mq) -> None:
    job = claimed(mq)
    job.log("kept until the job goes")
    mq.complete(job, 1)
    mq.remove("q", "a")
    assert [k for k in keys_of(mq, "q") if ":job:" in k] == []
    with pytest.raises(JobNotFound):
        mq.job_logs("q", "a")
    # retention: a queue that keeps no completed job drops the row and its log
    mq2 = EchoMQ(mq.client, prefix="emq", queues={"r": {"KEEP_COMPLETED": 0}})
    for n in range(3):
        job = claimed(mq2, "r", f"r{n}")
        job.log("bye")
        mq2.complete(job, n)
    mq2.lifecycle.prune("r")
    assert [k for k in keys_of(mq2, "r") if ":job:" in k] == []


def test_a_delayed_job_s_log_goes_when_it_is_removed(mq) -> None:
    job = claimed(mq)
    job.log("tried once")
    mq.fail(job, "boom")  # delayed now
    mq.remove("q", "a")
    assert [k for k in keys_of(mq, "q") if ":job:" in k] == []


def test_job_logs_refuses_bad_bounds_and_unknown_jobs(mq) -> None:
    with pytest.raises(JobNotFound):
        mq.job_logs("q", "nope")
    claimed(mq)
    with pytest.raises(ValueError, match="start must be an int"):
        mq.job_logs("q", "a", "0")
    with pytest.raises(ValueError, match="end must be an int"):
        mq.job_logs("q", "a", 0, 1.5)
    with pytest.raises(ValueError, match=r"start must be an int line index below 2\*\*63"):
        mq.job_logs("q", "a", 10**30)
    with pytest.raises(ValueError, match=r"end must be an int line index below 2\*\*63"):
        mq.job_logs("q", "a", 0, -(2**63))
    assert mq.job_logs("q", "a") == []


def test_areport_progress_runs_off_the_loop(mq) -> None:
    job = claimed(mq)
    asyncio.run(job.areport_progress({"stage": "upload"}))
    assert mq.get_job("q", "a").progress == {"stage": "upload"}


# -- the admin: a progress column in the job list, progress and log on the page ------
@pytest.mark.django_db
def test_the_admin_shows_progress_in_the_list_and_progress_and_log_on_the_job_page(r, client):
    from django.urls import reverse
    from django.utils.html import escape

    from echomq_django import conf
    from echomq_django.admin.pages import job_url
    from echomq_django.models import MirroredJob
    from echomq_django.monitoring.mirror import mirror_queues
    from tests.support.factories import StaffUserFactory

    conf.reset()
    mq = conf.get_mq()
    try:
        job = claimed(mq, "media", "v1")
        job.report_progress(40)
        job.log("<b>frame</b> 1")
        mq.enqueue("media", "prog.steps", None, job_id="v2")
        (other,) = mq.claim("media")
        other.report_progress({"stage": "upload", "done": 3, "of": 8, "file": "x" * 40})
        mirror_queues(mq, ["media"])
        assert MirroredJob.objects.get(job_id="v1").progress == "40"
        client.force_login(StaffUserFactory())
        listing = client.get(reverse("admin:echomq_django_mirroredjob_changelist")).content
        listing = listing.decode()
        # under the state, in its column
        assert '<span class="emq-sub emq-progress" title="40%">progress 40%</span>' in listing
        cut = '{"stage": "upload", "done": 3, "of": 8,…'  # PROGRESS_CHARS, the whole as title
        assert f">progress {escape(cut)}</span>" in listing
        detail = client.get(job_url("media", "v1"), follow=True)
        html = detail.content.decode()
        assert detail.context["logs"] == ["<b>frame</b> 1"]
        assert '<td id="emq-progress">40%</td>' in html
        assert "&lt;b&gt;frame&lt;/b&gt; 1" in html and "<b>frame" not in html
        job.report_progress(80)  # the page reads Redis live; the list, the mirror
        detail = client.get(job_url("media", "v1"), follow=True)
        assert '<td id="emq-progress">80%</td>' in detail.content.decode()
    finally:
        conf.reset()


def test_a_bad_keep_logs_is_named_with_its_rule():
    from echomq_django.conf.schema import problems

    cfg = {"URL": "redis://127.0.0.1:1/0", "QUEUES": {"media": {"KEEP_LOGS": -1}}}
    assert problems(cfg) == [
        (
            "echomq_django.E019",
            "queue 'media': KEEP_LOGS must be an integer from 1 to 10000, got -1",
            "KEEP_LOGS is the lines each job's log keeps (the newest); the default is 100.",
        )
    ]


def job_keys_left(mq, queue: str) -> list[str]:
    return sorted(k for k in keys_of(mq, queue) if ":job:" in k)


def test_a_removed_flow_s_running_child_drops_its_log_and_errors_when_it_finishes(mq) -> None:
    from tests.support.jobkit import leaf, node

    mq.add_flow(node("p", [leaf("c1")]))
    for attempt in (1, 2, 3):
        (c1,) = mq.claim("q")
        c1.log(f"attempt {attempt}")
        if attempt < 3:
            mq.fail(c1, f"boom {attempt}")
            mq.client.zadd(mq.keys.queue("q").delayed, {"c1": 0})  # due now
            mq.timers.promote_delayed("q")
    keys = mq.keys.job_keys("q", "c1")
    assert mq.client.lrange(keys.errors, 0, -1) == [b"boom 1"]
    assert mq.attempt_errors("q", "c1") == ["boom 1", "boom 2"]
    mq.remove("q", "p")  # c1 is active: marked orphaned, dropped once it finishes
    assert mq.client.exists(keys.logs, keys.errors) == 2
    mq.fail(c1, "boom 3", dead=True)
    mq.lifecycle.prune("q")
    assert job_keys_left(mq, "q") == []


def test_dropping_a_parent_s_unprocessed_children_drops_their_logs(mq) -> None:
    from tests.support.jobkit import leaf, node

    mq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    c1 = mq.claim("q", 1)[0]
    c1.log("ran once")
    c1.log("a second line: the log's list")
    assert mq.fail(c1, "boom") in (JobState.DELAYED, JobState.PENDING)
    assert mq.client.exists(mq.keys.job_keys("q", c1.id).logs) == 1
    mq.remove_unprocessed_children("q", "p")
    assert [k for k in job_keys_left(mq, "q") if f":job:{c1.id}" in k] == []


def test_progress_entries_keep_the_events_stream_s_cap(tmq) -> None:
    """A busy handler's progress cannot grow the events stream: its entries
    go through the same capped writer (lib/emit.lua, EVENTS_MAXLEN 10,000)."""
    tmq.enqueue_many("q", [("n", i) for i in range(10_000)])  # the stream at its cap
    (job,) = tmq.claim("q")
    for n in range(300):
        job.report_progress(n / 3)
    events = tmq.keys.queue("q").events
    assert 10_000 <= tmq.client.xlen(events) < 10_000 + 100  # one stream node at most above
    ((_, last),) = tmq.client.xrevrange(events, count=1)
    assert last == {b"e": b"progress", b"id": job.id.encode(), b"p": b"99.66666666666667"}
