"""The scripts' own write on one server (``Scripts._written``): EVALSHAs packed
by hiredis and read back on a pooled connection, and redis-py's pipeline when
hiredis is missing, an argument does not pack, or the connection dropped.
docs/explanation/performance.md#the-scripts-own-write"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from echomq_django import EchoMQ, JobState, RedisUnavailable
from echomq_django.protocol import scripts


def _drive(mq: EchoMQ) -> list:
    """The same calls, one at a time and pipelined, with refusals among them:
    what each gave back, as plain values."""
    mq.enqueue("q", "n", {"v": 1}, job_id="a")
    mq.enqueue("q", "n", {"v": 2}, job_id="b")
    jobs = mq.claim("q", 2, 30_000, token="t1")
    again = mq.claim("q", 2, 30_000, token="t1")  # the same token: a replay, the same jobs
    outcomes = mq.complete_many([(jobs[0], "r-a"), (jobs[1], 2.5)])
    twice = mq.complete_many([(jobs[0], "again"), (jobs[1], "again")])  # refused, pipelined
    with pytest.raises(Exception) as alone:  # refused, alone
        mq.extend_lease(jobs[0], 1_000)
    return [
        [(j.id, j.payload, j.attempts) for j in jobs],
        [j.id for j in again],
        [o.state for o in outcomes],
        [type(o).__name__ for o in twice],
        type(alone.value).__name__,
        [mq.get_job("q", i).result for i in ("a", "b")],
    ]


def test_the_own_write_gives_what_the_pipeline_gives(r, monkeypatch) -> None:
    pytest.importorskip("hiredis")  # the dj6 leg installs the [fast] extra
    sent = []
    real = scripts.Scripts._written
    monkeypatch.setattr(
        scripts.Scripts,
        "_written",
        lambda self, calls: sent.append(len(calls)) or real(self, calls),
    )
    fast = _drive(EchoMQ(r, prefix="emq"))
    assert sent and all(n >= 1 for n in sent)
    r.flushall()
    monkeypatch.setattr(scripts, "_pack", None)  # no hiredis: redis-py's pipeline
    slow = _drive(EchoMQ(r, prefix="emq"))
    assert fast == slow
    assert fast[:3] == [
        [("a", {"v": 1}, 1), ("b", {"v": 2}, 1)],
        ["a", "b"],
        [JobState.COMPLETED, JobState.COMPLETED],
    ]
    assert fast[3:] == [["JobNotActive", "JobNotActive"], "JobNotActive", ["r-a", 2.5]]


def test_a_connection_cut_under_a_call_is_an_outage_and_the_next_call_works(
    r, redis_server, monkeypatch
) -> None:
    """Cut while the server holds the call (CLIENT PAUSE WRITE): the caller
    gets ``RedisUnavailable``, as through redis-py; the next call opens a
    new connection."""
    mq = EchoMQ(r, prefix="emq")
    gave, raised = [], []
    real = scripts.Scripts._written
    monkeypatch.setattr(
        scripts.Scripts, "_written", lambda self, calls: _noted(gave, real(self, calls))
    )
    mq.enqueue("q", "n", None, job_id="a")

    def enqueue_b() -> None:
        try:
            mq.enqueue("q", "n", None, job_id="b")
        except RedisUnavailable as err:
            raised.append(err)

    admin = redis.Redis.from_url(redis_server)
    try:
        admin.execute_command("CLIENT", "PAUSE", 400, "WRITE")
        call = threading.Thread(target=enqueue_b)
        call.start()
        time.sleep(0.15)  # its EVALSHA is written and held by the pause
        killed = admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        call.join(5)
    finally:
        admin.close()
    assert killed >= 1 and len(raised) == 1  # (the session's server has other clients too)
    assert [j.id for j in mq.claim("q", 5)] == ["a"]
    enqueue_b()
    assert [j.id for j in mq.claim("q", 5)] == ["b"]
    # five single calls: with hiredis the own write sent each (1 reply), the cut
    # one raising through it; without, the first enqueue and the first claim went
    # through redis-py's pipeline with their loads, the rest through its Script
    assert gave == ([1] * 4 if scripts._pack is not None else [None, None])


def _noted(gave: list, replies):
    gave.append(None if replies is None else len(replies))
    return replies


def test_an_argument_hiredis_does_not_pack_gets_redis_py_s_error(r) -> None:
    mq = EchoMQ(r, prefix="emq")
    calls = [("enqueue", *_enqueue_call(mq, None))]
    with pytest.raises(redis.exceptions.DataError, match="NoneType"):
        mq.scripts.run_many(calls)
    assert r.dbsize() == 0


def _enqueue_call(mq: EchoMQ, bad):
    """The keys and args of an ``enqueue`` call with ``bad`` as its last argument."""
    src = mq.scripts.sources["enqueue"]
    keys = [f"emq:{{q}}:k{i}" for i in range(src.nkeys)]
    return keys, ["x"] * (src.nargv - 1) + [bad]


@pytest.mark.parametrize("packed", ["hiredis", "redis-py"])
def test_a_script_is_loaded_with_its_first_call_in_the_same_round_trip(r, monkeypatch, packed):
    """One server: a client loads no script ahead of its first pipelined call;
    each goes ahead of its first EVALSHA in the same round trip, once, so none
    answers NOSCRIPT and no script the client never runs is loaded. (Without
    hiredis a single call after its script's first goes through redis-py's
    ``Script``, as before.)"""
    if packed == "hiredis":
        pytest.importorskip("hiredis")
    else:
        monkeypatch.setattr(scripts, "_pack", None)
    first = EchoMQ(r, prefix="emq")
    for queue in ("q", "q2"):
        first.enqueue_many(queue, [("n", 1), ("n", 2)])
    jobs = [job for queue in ("q", "q2") for job in first.claim(queue, 2, 30_000)]
    r.script_flush()
    r.config_resetstat()
    mq = EchoMQ(r, prefix="emq")  # a fresh client, as at a worker's start
    trips = []
    real = scripts.Scripts._confirmed
    monkeypatch.setattr(
        scripts.Scripts,
        "_confirmed",
        lambda self, *a, **k: trips.append(len(a[0])) or real(self, *a, **k),
    )
    for pair in ((jobs[0], jobs[2]), (jobs[1], jobs[3])):  # a queue each: two calls a trip
        outcomes = mq.complete_many([(job, job.id) for job in pair])
        assert [o.state for o in outcomes] == [JobState.COMPLETED] * 2
    mq.enqueue("q", "n", 3, job_id="c")  # single calls: their first ones load too
    assert [j.id for j in mq.claim("q", 1)] == ["c"]
    assert mq.claim("q", 1) == []
    stats = r.info("commandstats")
    assert stats["cmdstat_script|load"]["calls"] == 3  # complete, enqueue, claim: once each
    assert (stats["cmdstat_evalsha"]["calls"], stats["cmdstat_evalsha"]["failed_calls"]) == (7, 0)
    assert trips[:4] == [2, 2, 1, 1]  # a round trip each (a later single call: redis-py's
    # Script without hiredis)
    sources = mq.scripts._scripts
    assert r.script_exists(sources["complete"].sha, sources["fail"].sha) == [True, False]
    assert [mq.get_job(j.queue, j.id).result for j in jobs] == [j.id for j in jobs]


@pytest.mark.parametrize("packed", ["hiredis", "redis-py"])
def test_calls_whose_scripts_were_flushed_are_sent_again_in_one_round_trip(r, monkeypatch, packed):
    """One server: a batch that meets NOSCRIPT (a restart, SCRIPT FLUSH) is sent again, its
    loads ahead, in one more round trip: not three per call through redis-py's ``Script``."""
    if packed == "hiredis":
        pytest.importorskip("hiredis")
    else:
        monkeypatch.setattr(scripts, "_pack", None)
    mq = EchoMQ(r, prefix="emq")
    for queue in ("q", "q2"):
        mq.enqueue_many(queue, [("n", 1), ("n", 2)])
    jobs = [job for queue in ("q", "q2") for job in mq.claim(queue, 2, 30_000)]
    mq.complete_many([(jobs[0], 0), (jobs[2], 0)])  # complete is loaded: no load ahead
    r.script_flush()
    r.config_resetstat()
    trips, one_by_one = [], []
    real = scripts.Scripts._one_server
    monkeypatch.setattr(
        scripts.Scripts,
        "_one_server",
        lambda self, calls: trips.append(len(calls)) or real(self, calls),
    )
    monkeypatch.setattr(
        redis.commands.core.Script, "__call__", lambda *a, **k: one_by_one.append(a)
    )
    outcomes = mq.complete_many([(jobs[1], "b"), (jobs[3], "d")])  # a queue each: two calls
    assert [o.state for o in outcomes] == [JobState.COMPLETED] * 2
    assert (trips, one_by_one) == ([2, 2], [])
    stats = r.info("commandstats")
    assert stats["cmdstat_script|load"]["calls"] == 1
    assert (stats["cmdstat_evalsha"]["calls"], stats["cmdstat_evalsha"]["failed_calls"]) == (4, 2)
    assert [mq.get_job(j.queue, j.id).result for j in (jobs[1], jobs[3])] == ["b", "d"]


@pytest.mark.parametrize("packed", ["hiredis", "redis-py"])
def test_scripts_flushed_every_2_ms_while_a_worker_drains_cost_no_job(
    r, redis_server, monkeypatch, packed
) -> None:
    """``SCRIPT FLUSH`` every 2 ms for a second while a worker drains 3,000
    jobs: a call that meets NOSCRIPT again after its load (the flush landed
    between the two) never ran, so it is an outage the worker waits out, not
    an error that ends it (docs/explanation/reliability.md#not-now-is-not-no).
    Every job completes once and the worker returns when stopped."""
    from echomq_django import Worker
    from tests.support.workerkit import Background, wait_for

    if packed == "hiredis":
        pytest.importorskip("hiredis")
    else:
        monkeypatch.setattr(scripts, "_pack", None)
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue_many("q", [("t.echo", i) for i in range(3_000)])
    flusher, stop = redis.Redis.from_url(redis_server), threading.Event()

    def flush() -> None:
        end = time.monotonic() + 1.0
        while time.monotonic() < end and not stop.is_set():
            flusher.script_flush()
            time.sleep(0.002)

    flushing = threading.Thread(target=flush, daemon=True)
    flushing.start()
    worker = Worker(["q"], mq=mq, concurrency=4, register=False)
    bg = Background(worker)
    try:
        wait_for(lambda: mq.counts("q")["completed"] == 3_000, timeout=60, what="every job")
    finally:
        stop.set()
        flushing.join(10)
        worker.stop()
        bg.join(60)  # raises what ended the worker, if anything did
        flusher.close()
    assert worker.loop.reporter.stats["completed"] == 3_000
    assert (mq.counts("q")["active"], mq.counts("q")["pending"]) == (0, 0)


class _OldPool(redis.ConnectionPool):
    """redis-py 5.0's ``get_connection``, which requires a command's name."""

    def get_connection(self, command_name, *keys, **options):
        self.names = [*getattr(self, "names", []), command_name]
        return super().get_connection()


def test_a_connection_is_taken_from_a_pool_that_asks_a_command_name(redis_server) -> None:
    """The own write takes its connection with ``routing.connection_from``, which
    passes a name only where the pool's signature requires one."""
    pool = _OldPool.from_url(redis_server)
    try:
        conn = scripts.routing.connection_from(pool)
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG")
        pool.release(conn)
        assert pool.names == ["EVALSHA"]
        assert scripts.routing._name_argument(redis.ConnectionPool) == ()  # today's: none
    finally:
        pool.disconnect()
