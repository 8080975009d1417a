"""The async pool (``Worker(pool="async")``, ``runworker --pool async``,
docs/howto/async-handlers.md#the-async-pool), on both rigs: ``async def``
handlers run as coroutines on one event loop and report as on the thread
pool (results, errors, retries, progress and log lines, a flow's parent);
a coroutine past its time limit is cancelled and its attempt fails with the
timeout error; a cancel reaches a running coroutine; a sync handler runs on
a slot thread; a coroutine that blocks the loop is named; a stop lets the
running coroutines finish, a second one cancels them; autoscale and the
pool commands size the coroutines; bad settings are refused."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from echomq_django import EchoMQ, Flow, JobState, Unrecoverable, Worker, handler
from echomq_django.runners.aio import pool as aio_pool
from tests.support.workerkit import Background, burst, wait_for
from tests.test_runner_commands import run_command
from tests.test_tracing import exporter  # noqa: F401 (a fixture)

CANCELLED: list[str] = []  # job ids whose coroutine saw CancelledError
RUNNING = 0  # ap.count: coroutines running now
MOST = 0  # ap.count: the most at once


@handler("ap.count")
async def count(job):
    """Counts the coroutines running at once (``MOST``), waits
    ``payload`` seconds, returns the loop thread's name."""
    global RUNNING, MOST
    RUNNING += 1
    MOST = max(MOST, RUNNING)
    try:
        await asyncio.sleep(job.payload)
    finally:
        RUNNING -= 1
    return threading.current_thread().name


@handler("ap.flaky")
async def flaky(job):
    """Raises on attempts 1..``payload``, then returns the attempt."""
    await asyncio.sleep(0)
    if job.attempts <= job.payload:
        raise RuntimeError(f"flaky attempt {job.attempts}")
    return job.attempts


@handler("ap.stolen")
async def stolen(job):
    """Raises ``Unrecoverable``: dead at once."""
    raise Unrecoverable("card reported stolen")


@handler("ap.hang")
async def hang(job):
    """Awaits ``payload`` seconds; records a cancel in ``CANCELLED``."""
    try:
        await asyncio.sleep(job.payload)
    except asyncio.CancelledError:
        CANCELLED.append(job.id)
        raise
    return "woke"


@handler("ap.until_cancelled")
async def until_cancelled(job):
    """Awaits until the worker marks the job cancelled, then returns."""
    while not job.cancelled:
        await asyncio.sleep(0.01)
    return "stopped"


@handler("ap.report")
async def report(job):
    """Reports progress 50 and two log lines, returns "done"."""
    await job.areport_progress(50)
    await job.alog("half way")
    job.log("sync call too")
    return "done"


@handler("ap.sum")
async def sum_children(job):
    """Returns the sum of the children's results."""
    await asyncio.sleep(0)
    return sum(job.children_values().values())


@handler("ap.where")
async def where(job):
    """Returns the threads its coroutine and its thread-sensitive sync calls ran on."""
    from asgiref.sync import sync_to_async

    name = threading.current_thread
    return [name().name, await sync_to_async(lambda: name().name)()]


@handler("ap.sync")
def sync_name(job):
    """A sync handler: returns its thread's name."""
    return threading.current_thread().name


@handler("ap.sync_block")
def sync_block(job):
    """A sync handler that sleeps ``payload`` seconds."""
    time.sleep(job.payload)
    return "late"


@handler("ap.block_loop")
async def block_loop(job):
    """Blocks the loop (``time.sleep``, no await) until the pool's lag
    watch saw it (at most 10 s)."""
    deadline = time.monotonic() + 10
    while not WATCHED[0].lag.blocked and time.monotonic() < deadline:
        time.sleep(0.01)
    return "unblocked"


WATCHED: list = []  # ap.block_loop: the pool it blocks


@pytest.fixture(autouse=True)
def _fresh():
    global MOST
    CANCELLED.clear()
    MOST = 0


def start(mq, concurrency=2, **kw) -> tuple[Worker, Background]:
    worker = Worker(["q"], concurrency=concurrency, mq=mq, pool="async", block_timeout=0.2, **kw)
    bg = Background(worker)
    wait_for(lambda: worker.loop.pool is not None, what="the pool")
    return worker, bg


def stop(worker, bg) -> int:
    worker.stop()
    return bg.join()


def test_coroutines_run_at_once_on_one_loop_and_report(mq) -> None:
    for i in range(8):
        mq.enqueue("q", "ap.count", 0.2, job_id=f"c{i}")
    mq.enqueue("q", "t.async_fail", None, job_id="bad", max_attempts=1)
    worker, processed = burst(mq, ["q"], concurrency=4, pool="async")
    assert (processed, worker.pool_kind, MOST) == (9, "async", 4)
    assert worker.stats == {"completed": 8, "failed": 0, "dead": 1, "lost": 0, "postponed": 0}
    assert {mq.get_job("q", f"c{i}").result for i in range(8)} == {"echomq-worker"}
    bad = mq.get_job("q", "bad")
    assert bad.state is JobState.DEAD
    # the error starts at the handler's frame, as on the thread pool
    lines = bad.error.splitlines()
    assert lines[:2] == ["ValueError: async boom", "Traceback (most recent call last):"]
    assert lines[2].endswith(", in async_fail") and "workerapp/jobs.py" in lines[2]
    assert len(lines) == 5  # summary, header, the handler's frame and line, the exception


def test_retries_and_unrecoverable_follow_the_policy(mq) -> None:
    mq.enqueue("q", "ap.flaky", 2, job_id="f", max_attempts=3, backoff_ms=0)
    mq.enqueue("q", "ap.stolen", None, job_id="s", max_attempts=5)
    worker, _ = burst(mq, ["q"], concurrency=2, pool="async")
    f, s = mq.get_job("q", "f"), mq.get_job("q", "s")
    assert (f.state, f.result, f.attempts) == (JobState.COMPLETED, 3, 3)
    assert (s.state, s.attempts, s.error.splitlines()[0]) == (
        JobState.DEAD,
        1,
        "Unrecoverable: card reported stolen",
    )
    assert worker.stats == {"completed": 1, "failed": 2, "dead": 1, "lost": 0, "postponed": 0}


def test_a_coroutine_past_its_time_limit_is_cancelled_and_its_attempt_fails(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "ap.hang", 60, job_id="h", timeout_ms=200, max_attempts=1)
    wait_for(lambda: mq.get_job("q", "h").state is JobState.DEAD, what="the time limit")
    assert mq.get_job("q", "h").error == (
        "TimeoutError: the attempt ran longer than its time limit of 200 ms "
        "(timeout_ms / TIMEOUT_MS); its coroutine was cancelled (asyncio.Task.cancel)"
    )
    wait_for(lambda: worker.loop.timeouts.stuck == 0, what="the cancel to land")
    assert CANCELLED == ["h"] and worker.loop.pool.running == 0
    mq.enqueue("q", "ap.count", 0, job_id="next")
    wait_for(lambda: mq.get_job("q", "next").state is JobState.COMPLETED, what="a job after")
    assert stop(worker, bg) == 2 and worker.left_running == 0


def test_a_sync_handler_past_its_time_limit_has_its_late_result_discarded(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "ap.sync_block", 0.5, job_id="b", timeout_ms=100, max_attempts=1)
    wait_for(lambda: mq.get_job("q", "b").state is JobState.DEAD, what="the time limit")
    assert mq.get_job("q", "b").error.endswith("; the handler's late result is discarded")
    wait_for(lambda: worker.loop.timeouts.stuck == 0, what="the handler to return")
    assert (mq.get_job("q", "b").state, mq.get_job("q", "b").result) == (JobState.DEAD, None)
    stop(worker, bg)


def test_a_cancel_reaches_a_running_coroutine_and_its_result_is_dropped(r) -> None:
    mq = EchoMQ(r)
    mq.enqueue("q", "ap.until_cancelled", None, job_id="long")
    worker = Worker(["q"], mq=mq, pool="async", lease_ms=300, heartbeat_ms=20)
    bg = Background(worker)
    try:
        wait_for(lambda: mq.get_job("q", "long").state == "active", what="the claim")
        assert mq.cancel("q", "long").state == "active"
        wait_for(lambda: mq.get_job("q", "long").state == "dead", what="the death")
    finally:
        stop(worker, bg)
    job = mq.get_job("q", "long")
    assert (job.error, job.result, worker.stats["completed"]) == ("cancelled", None, 0)


def test_progress_and_log_lines_from_a_coroutine(mq) -> None:
    mq.enqueue("q", "ap.report", None, job_id="p")
    burst(mq, ["q"], concurrency=1, pool="async")
    job = mq.get_job("q", "p")
    assert (job.state, job.result, job.progress) == (JobState.COMPLETED, "done", 50)
    assert mq.job_logs("q", "p") == ["half way", "sync call too"]


def test_a_flow_parent_runs_on_the_async_pool(mq) -> None:
    children = [Flow("q", "ap.flaky", 0, job_id=f"n{i}") for i in range(3)]  # each returns 1
    mq.add_flow(Flow("q", "ap.sum", job_id="p", children=children))
    _, processed = burst(mq, ["q"], concurrency=2, pool="async")
    parent = mq.get_job("q", "p")
    assert (processed, parent.state, parent.result) == (4, JobState.COMPLETED, 3)


def test_a_sync_handler_runs_on_a_slot_thread(mq) -> None:
    for i in range(3):
        mq.enqueue("q", "ap.sync", None, job_id=f"s{i}")
    burst(mq, ["q"], concurrency=1, pool="async")
    names = {mq.get_job("q", f"s{i}").result for i in range(3)}
    assert names == {"echomq-worker_sync_1_0"}  # one slot, kept across jobs


def test_slot_threads_are_bounded_by_the_pool_size(mq) -> None:
    """Slots are made on first use and kept: never more than the coroutines
    at once, however many jobs; a shrink ends the spare ones."""
    for i in range(30):
        mq.enqueue("q", "ap.sync", None, job_id=f"s{i}")
    worker, bg = start(mq, concurrency=3)
    try:
        wait_for(lambda: mq.counts("q")["completed"] == 30, what="the jobs")
        names = {mq.get_job("q", f"s{i}").result for i in range(30)}
        pool = worker.loop.pool
        assert names <= {f"echomq-worker_sync_{n}_0" for n in (1, 2, 3)}
        assert (pool._made <= 3, len(pool._slots) <= 3) == (True, True)
        worker.loop.resize(1)
        wait_for(lambda: len(pool._slots) <= 1, what="the spare slots ended")
    finally:
        stop(worker, bg)


def test_the_async_orm_runs_with_old_connections_closed_around_the_job(
    r, transactional_db, monkeypatch
) -> None:
    """Django's rule, as for a request: ``close_old_connections`` before the
    job's first sync call and after the job, on its slot's thread; not at
    all for a job that made no sync call."""
    from django.contrib.auth.models import User

    closed = []
    real = aio_pool._close_connections

    def recorded():
        closed.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(aio_pool, "_close_connections", recorded)
    User.objects.create(username="a")
    mq = EchoMQ(r)
    mq.enqueue("q", "t.async_orm", None, job_id="orm")
    mq.enqueue("q", "t.async_echo", None, job_id="plain")
    burst(mq, ["q"], concurrency=1, pool="async")
    job = mq.get_job("q", "orm")
    assert job.result == {"users": 1, "thread": "echomq-worker"}  # the loop's thread
    assert mq.get_job("q", "plain").state is JobState.COMPLETED
    assert closed == ["echomq-worker_sync_1_0"] * 2  # the ORM job's, none for the other


def test_a_jobs_thread_sensitive_calls_run_on_its_slot_thread(mq) -> None:
    for i in range(3):
        mq.enqueue("q", "ap.where", None, job_id=f"w{i}")
    burst(mq, ["q"], concurrency=1, pool="async")
    threads = [mq.get_job("q", f"w{i}").result for i in range(3)]
    assert threads == [["echomq-worker", "echomq-worker_sync_1_0"]] * 3  # a slot kept


def test_a_coroutine_that_blocks_the_loop_is_named(mq, caplog) -> None:
    worker, bg = start(mq)
    WATCHED[:] = [worker.loop.pool]
    with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
        mq.enqueue("q", "ap.block_loop", None, job_id="b")
        wait_for(lambda: mq.get_job("q", "b").state is JobState.COMPLETED, what="the job")
        stop(worker, bg)
    assert worker.loop.pool.lag.blocked == 1
    blocked = [m for m in caplog.messages if "event loop has been blocked" in m]
    assert len(blocked) == 1 and "by job q/b (ap.block_loop)" in blocked[0]


def test_a_stop_lets_running_coroutines_finish(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "t.async_sleep", 0.5, job_id="s")
    wait_for(lambda: mq.get_job("q", "s").state is JobState.ACTIVE, what="the claim")
    assert stop(worker, bg) == 1
    assert (mq.get_job("q", "s").state, mq.get_job("q", "s").result) == (JobState.COMPLETED, 0.5)
    assert worker.abandoned == 0


def test_a_second_stop_cancels_the_coroutines_and_leaves_their_leases(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "ap.hang", 30, job_id="h")
    wait_for(lambda: mq.get_job("q", "h").state is JobState.ACTIVE, what="the claim")
    worker.stop()
    worker.stop(force=True)
    assert bg.join() == 0
    assert (worker.abandoned, CANCELLED) == (1, ["h"])
    assert mq.get_job("q", "h").state is JobState.ACTIVE  # left to its lease


def test_autoscale_sizes_the_coroutines(mq) -> None:
    worker = Worker(["q"], mq=mq, pool="async", autoscale=(8, 1), block_timeout=0.2,
                    sweep_interval=0.1)  # fmt: skip
    worker.loop.scale.shrink_after_s = 0.3
    for i in range(64):
        mq.enqueue("q", "ap.count", 0.02, job_id=f"s{i}")
    sizes = []
    bg = Background(worker)
    wait_for(lambda: sizes.append(worker.loop.concurrency) or mq.counts("q")["completed"] == 64,
             what="the backlog")  # fmt: skip
    assert (max(sizes), worker.loop.scale.grown, MOST) == (8, 3, 8)  # 1 -> 2 -> 4 -> 8
    wait_for(lambda: worker.loop.concurrency == 1, what="back to one handler")
    assert (worker.loop.scale.shrunk, worker.loop.pool.size) == (3, 1)
    stop(worker, bg)


def test_pool_commands_grow_and_shrink_the_coroutines(mq) -> None:
    worker = Worker(["q"], mq=mq, pool="async", concurrency=2, block_timeout=0.5, beat_s=0.2)
    bg = Background(worker)
    try:
        wait_for(lambda: worker.waiting, what="the worker idle")
        [(cid, _)] = mq.commands.send("pool-grow", 2, worker=worker.process_id)
        assert mq.commands.wait(cid, 10)["detail"] == "2 -> 4 handlers"
        assert worker.loop.pool.size == 4
        [(cid, _)] = mq.commands.send("pool-shrink", 3, worker=worker.process_id)
        assert mq.commands.wait(cid, 10)["detail"] == "4 -> 1 handlers"
        for i in range(4):
            mq.enqueue("q", "ap.count", 0.05, job_id=f"c{i}")
        wait_for(lambda: mq.counts("q")["completed"] == 4, what="the jobs")
        assert (worker.loop.pool.size, MOST) == (1, 1)
    finally:
        stop(worker, bg)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pool": "asyncio"}, "pool must be one of thread, process, async, got 'asyncio'"),
        ({"pool": "async", "max_memory_per_child": 100},
         "max_memory_per_child applies to the process pool only (pool='process')"),
        ({"pool": "async", "max_jobs_per_child": 10},
         "max_jobs_per_child applies to the process pool only (pool='process')"),
    ],
)  # fmt: skip
def test_bad_async_pool_settings_are_refused(redis_client, kw, message) -> None:
    with pytest.raises(ValueError) as err:
        Worker(["q"], mq=EchoMQ(redis_client), **kw)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--pool", "asyncio"), "--pool must be one of thread, process, async, got 'asyncio'"),
        (("--pool", "async", "--max-memory-per-child", "100"),
         "--max-memory-per-child applies to --pool process only"),
    ],
)  # fmt: skip
def test_runworker_refuses_a_flag_the_async_pool_does_not_take(r, db, args, message) -> None:
    assert run_command("runworker", "q", "--burst", *args) == (1, f"runworker: {message}\n")


def test_a_traced_coroutine_records_its_attempt_span(mq, exporter) -> None:  # noqa: F811
    from opentelemetry import trace as otel_trace

    _, memory = exporter
    with otel_trace.get_tracer("tests").start_as_current_span("caller"):
        mq.enqueue("q", "ap.flaky", 0, job_id="ok")
        mq.enqueue("q", "ap.stolen", None, job_id="dead")
    burst(mq, ["q"], concurrency=2, pool="async")
    finished = memory.get_finished_spans()
    adds = {s.attributes["messaging.message.id"]: s for s in finished if s.name == "echomq enqueue"}
    runs = {s.attributes["messaging.message.id"]: s for s in finished
            if s.name.startswith("echomq run ")}  # fmt: skip
    assert {i: s.attributes["echomq.job.outcome"] for i, s in runs.items()} == {
        "ok": "completed",
        "dead": "dead",
    }
    assert all(runs[i].parent.span_id == adds[i].context.span_id for i in runs)
    # the stored error starts at the handler, traced or not
    assert mq.get_job("q", "dead").error.splitlines()[2].endswith(", in stolen")
