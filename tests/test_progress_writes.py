"""A worker's progress and log writes (runners/flusher.py,
docs/howto/progress-and-logs.md#when-a-write-is-visible): they leave the
handler without a round trip, land before their job's completion (the
events stream's order says so), a write whose lease was lost is dropped and
counted and the handler's next call raises it, unsent writes are bounded,
and bad input still raises at once with nothing written; on both rigs."""

from __future__ import annotations

import threading
import time

import pytest

import echomq_django as emq
from echomq_django import JobState, LeaseLost, PayloadError, handler
from echomq_django.core.exceptions import MESSAGES
from echomq_django.runners.flusher import Flusher, Refused
from tests.support.workerkit import burst
from tests.test_progress import claimed

SEEN: dict[str, object] = {}


@handler("pw.writes")
def writes(job):
    job.report_progress(50)
    job.log(f"line of {job.id}")
    job.report_progress(100)
    return job.id


@handler("pw.lost")
def loses_its_lease(job):
    job.report_progress(10)
    job._writes.flush()  # the first write lands
    real, job.lease = job.lease, "stale"
    job.log("written under a stale lease")
    job._writes.flush()  # refused: dropped and counted
    try:
        job.log("after the refusal")
    except LeaseLost as err:
        SEEN["error"] = err
    job.lease = real
    return "done"


@handler("pw.pool_lost")
def loses_its_lease_in_a_child(job):
    """In a handler process: the first write lands, then another worker
    takes the lease (the row's token changes); writes go on until one
    raises. Returns the name of what was raised."""
    client, row = job._mq.client, job._mq.keys.job(job.queue, job.id)
    job.report_progress(10)
    deadline = time.monotonic() + 10
    while client.hget(row, "progress") is None and time.monotonic() < deadline:
        time.sleep(0.01)  # relayed by the supervisor, sent by the worker's flusher
    client.hset(row, "lease", "taken")
    error = None
    while error is None and time.monotonic() < deadline:
        try:
            job.log("under a lost lease")
        except LeaseLost as err:
            error = err
        time.sleep(0.01)
    client.hset(row, "lease", job.lease)  # given back, so the job can complete
    return type(error).__name__


@handler("pw.bad")
def bad_input(job):
    for value in ("x", 101, {"big": "x" * 2000}):
        try:
            job.report_progress(value)
        except PayloadError as err:
            SEEN.setdefault("bad", []).append(str(err))
    try:
        job.log(b"bytes")
    except TypeError as err:
        SEEN["line"] = str(err)
    return "ok"


def counted(writes) -> dict[str, int]:
    """A flusher's writes sent and dropped (its round trips vary with timing)."""
    return {k: writes.stats[k] for k in ("sent", "dropped")}


def events_by_job(mq, queue="q") -> dict[str, list[str]]:
    """Each job's events, in the stream's order (its entry ids); a batch's
    entry (``id`` several ids) counts for each of them."""
    out: dict[str, list[str]] = {}
    for _id, fields in mq.client.xrange(mq.keys.queue(queue).events):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        for job_id in f["id"].split():
            out.setdefault(job_id, []).append(f["e"])
    return out


def test_every_job_s_writes_land_before_its_completion(mq) -> None:
    mq.enqueue_many("q", [("pw.writes", None, {"job_id": f"j{i}"}) for i in range(40)])
    worker, done = burst(mq, ["q"], concurrency=4)
    assert done == 40
    for i in range(40):
        job = mq.get_job("q", f"j{i}")
        assert (job.state, job.progress) == (JobState.COMPLETED, 100)
        assert mq.job_logs("q", f"j{i}") == [f"line of j{i}"]
    for job_id, kinds in events_by_job(mq).items():
        ends = [k for k in kinds if k in ("progress", "completed")]
        assert ends == ["progress", "progress", "completed"], job_id
    assert counted(worker.loop.writes) == {"sent": 120, "dropped": 0}


def test_the_reporter_sends_the_writes_when_the_flusher_thread_has_not(mq, monkeypatch) -> None:
    monkeypatch.setattr(Flusher, "run", lambda self: None)  # no flusher thread this run
    mq.enqueue_many("q", [("pw.writes", None, {"job_id": f"j{i}"}) for i in range(10)])
    worker, done = burst(mq, ["q"], concurrency=2)
    assert done == 10
    assert {mq.get_job("q", f"j{i}").progress for i in range(10)} == {100}
    for job_id, kinds in events_by_job(mq).items():
        ends = [k for k in kinds if k in ("progress", "completed")]
        assert ends == ["progress", "progress", "completed"], job_id
    assert (worker.loop.writes.stats["sent"], worker.loop.writes.pending()) == (30, 0)


def test_a_write_whose_lease_was_lost_is_dropped_and_the_next_call_raises(mq) -> None:
    SEEN.clear()
    mq.enqueue("q", "pw.lost", None, job_id="a")
    worker, _ = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "a")
    assert (job.state, job.progress, mq.job_logs("q", "a")) == (JobState.COMPLETED, 10, [])
    assert type(SEEN["error"]) is LeaseLost
    assert (
        str(SEEN["error"])
        == "job 'a' in queue 'q': lease token is stale "
        + MESSAGES["EMQLEASE"].split("stale ", 1)[1]
    )
    assert counted(worker.loop.writes) == {"sent": 1, "dropped": 1}


def test_bad_input_in_a_worker_raises_at_once_and_writes_nothing(mq) -> None:
    SEEN.clear()
    mq.enqueue("q", "pw.bad", None, job_id="a")
    worker, _ = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "a")
    assert (job.state, job.progress, mq.job_logs("q", "a")) == (JobState.COMPLETED, None, [])
    assert SEEN["bad"] == [
        "progress 'x': progress is a number from 0 to 100 or a JSON object of at most 1024 bytes",
        "progress 101: progress is a number from 0 to 100 or a JSON object of at most 1024 bytes",
        "progress is 2010 bytes of JSON: progress is a number from 0 to 100 or a JSON object of "
        "at most 1024 bytes",
    ]
    assert SEEN["line"] == "a job log line is a str, got bytes"
    assert "progress" not in events_by_job(mq)["a"]
    assert counted(worker.loop.writes) == {"sent": 0, "dropped": 0}


def test_unsent_writes_are_bounded_and_a_full_flusher_holds_the_handler(mq) -> None:
    job = claimed(mq)
    writes = Flusher(mq, max_pending=2)
    job._writes = writes
    job.log("one")
    job.report_progress(20)
    assert (writes.pending(), writes.put(job, None, "three", block=False)) == (2, False)
    third = threading.Thread(target=job.log, args=("three",))
    third.start()
    third.join(0.2)
    assert third.is_alive() and writes.pending() == 2  # held: no room
    writes.flush()
    third.join(5)
    assert not third.is_alive()
    writes.flush()
    assert (writes.pending(), counted(writes)) == (0, {"sent": 3, "dropped": 0})
    assert mq.job_logs("q", "a") == ["one", "three"]
    assert mq.get_job("q", "a").progress == 20


def test_one_call_carries_many_jobs_and_a_refusal_stops_only_its_own(mq) -> None:
    a, b = claimed(mq, job_id="a"), claimed(mq, job_id="b")
    b.lease = "stale"
    lines = [f"l{i}" for i in range(2500)]  # cut into entries of PER_ENTRY lines
    replies = mq.progress.write_many([(a, ["5", "6"], lines), (b, ["7"], ["x"])])
    # the held count is the last entry's: 100 lines kept, then its 500 added
    assert replies[0] == 600 and isinstance(replies[1], LeaseLost)
    assert mq.get_job("q", "a").progress == 6
    assert mq.get_job("q", "b").progress is None and mq.job_logs("q", "b") == []
    assert mq.job_logs("q", "a") == lines[-100:]  # the queue keeps KEEP_LOGS lines
    assert [k for k in events_by_job(mq)["a"] if k == "progress"] == ["progress", "progress"]


def test_writes_taken_before_a_refusal_is_known_are_dropped_with_it(mq) -> None:
    """A write put while an earlier one's send is in flight is refused with
    it, not sent later: were the lease to come back meanwhile (the process
    pool's test handler gives it back), it would land under a lost lease."""
    job = claimed(mq)
    real, job.lease = job.lease, "stale"
    writes = Flusher(mq)
    job._writes = writes
    job.log("first")
    with writes.riding():  # "first" is being sent: a second write waits behind it
        job.log("second")
        job.report_progress(30)
    assert type(job._writes) is Refused and writes.pending() == 0
    with pytest.raises(LeaseLost):
        job.log("third")
    job.lease = real
    writes.flush()
    assert (mq.job_logs("q", "a"), mq.get_job("q", "a").progress) == ([], None)
    assert counted(writes) == {"sent": 0, "dropped": 3}


def test_a_write_that_waited_for_room_through_a_refusal_raises(mq) -> None:
    """The bound is full with another job's write while a refusal comes
    back: the refused job's write waiting for room raises when room comes,
    and is never sent."""
    a, b = claimed(mq, job_id="a"), claimed(mq, job_id="b")
    real, a.lease = a.lease, "stale"
    writes = Flusher(mq, max_pending=1)
    a._writes = b._writes = writes
    a.log("first")
    raised: list[Exception] = []

    def second() -> None:
        try:
            a.log("second")
        except LeaseLost as err:
            raised.append(err)

    waiter = threading.Thread(target=second)
    with writes.riding():  # "first" is being sent
        b.log("b's")  # the bound is full again
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()  # waiting for room
    assert type(a._writes) is Refused and waiter.is_alive()
    writes.flush()  # b's write goes: room for a's, which is refused now
    waiter.join(5)
    assert [type(e) for e in raised] == [LeaseLost]
    a.lease = real
    writes.flush()
    assert (mq.job_logs("q", "a"), mq.job_logs("q", "b")) == ([], ["b's"])


def test_a_refused_job_raises_a_fresh_copy_of_its_error_each_call(mq) -> None:
    job = claimed(mq)
    job._writes = Refused(LeaseLost("the lease token of job q/a is stale"))
    for _ in range(2):
        with pytest.raises(LeaseLost, match="stale"):
            job.log("x")
    with pytest.raises(PayloadError):  # the value is checked first
        job.report_progress(-1)
    assert mq.job_logs("q", "a") == []


def test_an_async_handler_s_writes_take_no_thread_in_a_worker(mq) -> None:
    import asyncio

    class Seen(Flusher):
        def put(self, job, progress, line, block=True):
            self.threads = [*getattr(self, "threads", []), threading.get_ident()]
            return super().put(job, progress, line, block)

    job = claimed(mq)
    writes = Seen(mq)
    job._writes = writes
    asyncio.run(job.areport_progress(30))
    asyncio.run(job.alog("async line"))
    assert writes.threads == [threading.get_ident()] * 2  # the loop's own thread
    assert writes.pending() == 2
    writes.flush()
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (30, ["async line"])


@pytest.mark.e2e
def test_the_process_pool_relays_writes_ahead_of_the_reply(mq) -> None:
    mq.enqueue_many("q", [("pw.writes", None, {"job_id": f"j{i}"}) for i in range(12)])
    worker, done = burst(mq, ["q"], concurrency=2, pool="process")
    assert done == 12
    assert {mq.get_job("q", f"j{i}").progress for i in range(12)} == {100}
    assert mq.job_logs("q", "j7") == ["line of j7"]
    for job_id, kinds in events_by_job(mq).items():
        ends = [k for k in kinds if k in ("progress", "completed")]
        assert ends == ["progress", "progress", "completed"], job_id
    assert counted(worker.loop.writes) == {"sent": 36, "dropped": 0}


@pytest.mark.e2e
def test_a_child_s_write_under_a_lost_lease_is_dropped_and_a_later_call_raises(mq) -> None:
    mq.enqueue("q", "pw.pool_lost", None, job_id="a")
    worker, _ = burst(mq, ["q"], concurrency=1, pool="process")
    job = mq.get_job("q", "a")
    assert (job.state, job.result, job.progress) == (JobState.COMPLETED, "LeaseLost", 10)
    assert mq.job_logs("q", "a") == []
    assert worker.loop.writes.stats["sent"] == 1
    assert worker.loop.writes.stats["dropped"] >= 1


def test_a_completion_carries_writes_ahead_of_it_in_its_round_trip(mq) -> None:
    a, b = claimed(mq, job_id="a"), claimed(mq, job_id="b")
    calls, owners = mq.progress.calls([(a, ["70"], ["last line"]), (b, ["80"], [])])
    ahead = list(calls)
    outcomes = mq.complete_many([(a, "done")], ahead)
    assert [o.state for o in outcomes] == [JobState.COMPLETED]
    assert mq.progress.replies(2, owners, ahead) == [1, 0]  # replaced in place by the replies
    assert (mq.get_job("q", "a").progress, mq.job_logs("q", "a")) == (70, ["last line"])
    assert mq.get_job("q", "b").progress == 80
    assert [k for k in events_by_job(mq)["a"] if k in ("progress", "completed")] == [
        "progress",
        "completed",
    ]


def test_an_outage_keeps_the_writes_and_sends_them_first_after(mq) -> None:
    import redis

    from echomq_django import EchoMQ, RedisUnavailable
    from tests.support.rigs import free_port

    job = claimed(mq)
    away = EchoMQ(redis.Redis(port=free_port(), socket_connect_timeout=0.2), prefix="emq")
    writes = Flusher(away)
    job._writes = writes
    job.report_progress(10)
    job.log("before the outage")
    with pytest.raises(RedisUnavailable):
        writes.flush()
    assert (writes.pending(), counted(writes)) == (2, {"sent": 0, "dropped": 0})
    job.log("during the outage")
    writes.mq = mq  # Redis is back
    writes.flush()
    assert mq.job_logs("q", "a") == ["before the outage", "during the outage"]
    assert (mq.get_job("q", "a").progress, writes.pending()) == (10, 0)


@handler("pw.step")
def a_step_that_reports_then_holds(job):
    """Reports progress and a line, then ends its attempt without
    finishing: moved to delayed (payload ``move``) or held for a child."""
    if job.payload.get("again"):
        return "done"
    job.report_progress(40)
    job.log(f"step of {job.id}")
    if job.payload["move"]:
        job.update_payload({"move": True, "again": True})
        job.move_to_delayed(60_000)
    job.update_payload({"move": False, "again": True})
    job.add_children([emq.Flow("q2", "t.echo", 1)])  # a queue this burst leaves alone
    raise emq.WaitForChildren


@pytest.mark.parametrize("move", [True, False], ids=["move_to_delayed", "wait_for_children"])
def test_a_step_job_s_writes_land_before_its_attempt_ends(mq, monkeypatch, move) -> None:
    """The writes of an attempt that ends without a result (a step job's
    move or hold) are sent before the transition, which would refuse them
    (the job no longer active): with no flusher thread, the reporter sends
    them alone first."""
    monkeypatch.setattr(Flusher, "run", lambda self: None)  # only the reporter sends
    mq.enqueue("q", "pw.step", {"move": move}, job_id="s")
    worker, _ = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "s")
    want = JobState.DELAYED if move else JobState.AWAITING_CHILDREN
    assert (job.state, job.progress) == (want, 40)
    assert mq.job_logs("q", "s") == ["step of s"]
    assert counted(worker.loop.writes) == {"sent": 2, "dropped": 0}


def write_counts(registry, queue: str = "q") -> dict[str, float | None]:
    """The flusher's metrics as scraped: dropped by reason, and waited."""
    value = registry.get_sample_value
    return {
        "lease": value("echomq_progress_writes_dropped_total", {"queue": queue, "reason": "lease"}),
        "stopped": value(
            "echomq_progress_writes_dropped_total", {"queue": queue, "reason": "stopped"}
        ),
        "waited": value("echomq_progress_writes_waited_total", {"queue": queue}),
    }


def test_a_worker_counts_writes_dropped_under_a_lost_lease_in_its_metrics(mq) -> None:
    import prometheus_client

    from echomq_django.monitoring.metrics import ProcessMetrics

    registry = prometheus_client.CollectorRegistry()
    SEEN.clear()
    mq.enqueue("q", "pw.lost", None, job_id="a")
    _, done = burst(mq, ["q"], concurrency=1, metrics=ProcessMetrics(registry))
    assert done == 1
    assert type(SEEN["error"]) is LeaseLost
    assert write_counts(registry) == {"lease": 1.0, "stopped": None, "waited": None}


def test_each_reason_a_write_is_dropped_or_held_is_counted(mq) -> None:
    import prometheus_client
    import redis

    from echomq_django import EchoMQ
    from echomq_django.monitoring.metrics import ProcessMetrics
    from tests.support.rigs import free_port

    registry = prometheus_client.CollectorRegistry()
    metrics = ProcessMetrics(registry)
    # lease: a progress value and a line under a stale token, refused together
    job = claimed(mq, job_id="a")
    writes = Flusher(mq, metrics=metrics)
    job._writes, job.lease = writes, "stale"
    job.report_progress(5)
    job.log("refused")
    writes.flush()
    assert write_counts(registry) == {"lease": 2.0, "stopped": None, "waited": None}
    # waited: the bound (2 here) holds the third write until a send makes room
    job = claimed(mq, job_id="b")
    writes = Flusher(mq, max_pending=2, metrics=metrics)
    job._writes = writes
    job.log("one")
    job.log("two")
    third = threading.Thread(target=job.log, args=("three",))
    third.start()
    third.join(0.2)
    assert third.is_alive()
    writes.flush()
    third.join(5)
    writes.flush()
    assert mq.job_logs("q", "b") == ["one", "two", "three"]
    assert write_counts(registry)["waited"] == 1.0
    # stopped: Redis away when the run ends, three writes still unsent
    away = EchoMQ(redis.Redis(port=free_port(), socket_connect_timeout=0.2), prefix="emq")
    job = claimed(mq, job_id="c")
    writes = Flusher(away, metrics=metrics)
    job._writes = writes
    job.report_progress(7)
    job.log("lost")
    job.log("lost too")
    writes.close()
    writes.run()  # one last send, which fails: the writes are lost and counted
    assert (writes.pending(), writes.stats["dropped"]) == (0, 3)
    assert write_counts(registry) == {"lease": 2.0, "stopped": 3.0, "waited": 1.0}
    assert (mq.get_job("q", "c").progress, mq.job_logs("q", "c")) == (None, [])


def test_any_text_crosses_the_one_json_argument_unchanged(mq) -> None:
    """A call's jobs travel as one JSON array the script decodes (cjson):
    non-ASCII text, quotes, backslashes, control characters and an empty
    line land byte for byte, and so does a progress object's JSON."""
    job = claimed(mq)
    lines = ["é ü 日本 🎉", 'quote " back \\ nl \n tab \t nul \x00 end', "", "[1,2]"]
    value = mq.progress.progress_text({"stage": '日本 "x"', "n": 1})
    assert mq.progress.write_many([(job, [value], lines)]) == [4]
    assert mq.job_logs("q", "a") == lines
    assert mq.get_job("q", "a").progress == {"stage": '日本 "x"', "n": 1}
    raw = mq.client.hget(mq.keys.job("q", "a"), "progress").decode()
    assert raw == value
