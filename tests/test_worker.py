"""The worker in-process: ``Worker(...).run`` against the real test Redis, on
both rigs where the protocol matters."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from types import SimpleNamespace

import django
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ, Flow, JobRef, JobState, Outcome, RedisUnavailable, Worker
from echomq_django.runners.pool import error_text, unknown_name_error
from echomq_django.runners.pump import Pump
from tests.support.workerkit import Background, Clock, burst, wait_for

COUNTS0 = {
    "pending": 0,
    "active": 0,
    "delayed": 0,
    "completed": 0,
    "dead": 0,
    "awaiting_children": 0,
    "outbox": 0,
    "deadletter": 0,
}


def counts(mq, queue="q", **nonzero) -> None:
    assert mq.counts(queue) == {**COUNTS0, **nonzero}


def test_same_queue_flow_runs_to_the_parent(mq):
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[Flow("q", "t.echo", i, job_id=f"c{i}") for i in range(5)],
        )
    )
    worker, processed = burst(mq, ["q"])
    assert processed == 6
    parent = mq.get_job("q", "p")
    assert (parent.state, parent.result, parent.attempts) == (JobState.COMPLETED, 10, 1)
    assert mq.dependency_counts("q", "p")["remaining"] == 0
    assert worker.stats == {"completed": 6, "failed": 0, "dead": 0, "lost": 0, "postponed": 0}
    assert worker.abandoned == 0
    counts(mq, completed=6)


def test_a_claim_whose_reply_was_lost_gives_its_job_back(mq, monkeypatch):
    """Redis ran the worker's claim and the reply was lost (a connection
    error after the script ran): the worker asks again with the same token
    and gets that job back at once. With a new token it found nothing, and
    the job stayed active, unseen, until its lease expired."""
    mq.enqueue("q", "t.echo", "kept", job_id="j")
    real, calls = mq.claim, []

    def lose_first_reply(queue, count=1, lease_ms=None, token=None, yields_to=None):
        calls.append(token)
        jobs = real(queue, count, lease_ms, token=token, yields_to=yields_to)
        if len(calls) == 1:
            raise RedisUnavailable("Redis is unreachable: reply lost")  # what claim raises
        return jobs

    monkeypatch.setattr(mq, "claim", lose_first_reply)
    worker, processed = burst(mq, ["q"], concurrency=2)
    assert worker.stats["completed"] == 1
    assert processed == 1 and calls[0] == calls[1]
    job = mq.get_job("q", "j")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, "kept", 1)
    counts(mq, completed=1)


def test_a_tree_resolves_level_by_level(mq):
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="root",
            children=[
                Flow(
                    "q",
                    "t.sum_children",
                    job_id=f"mid{m}",
                    children=[
                        Flow("q", "t.echo", 10 * m + i, job_id=f"leaf{m}{i}") for i in range(3)
                    ],
                )
                for m in range(2)
            ],
        )
    )
    assert burst(mq, ["q"], concurrency=3)[1] == 9
    assert mq.get_job("q", "mid0").result == 0 + 1 + 2
    assert mq.get_job("q", "mid1").result == 10 + 11 + 12
    assert mq.get_job("q", "root").result == 36


def test_unrecoverable_dies_at_once_and_its_parent_policy_applies(redis_client):
    mq = EchoMQ(redis_client, prefix="emq", clock=Clock())
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[Flow("q", "t.unrecoverable", job_id="stolen", max_attempts=5)],
        )
    )
    assert burst(mq, ["q"])[1] == 1
    job = mq.get_job("q", "stolen")
    assert (job.state, job.attempts) == (JobState.DEAD, 1)
    assert job.error.splitlines()[0] == "Unrecoverable: card reported stolen"
    parent = mq.get_job("q", "p")
    assert parent.state == JobState.DEAD
    assert list(mq.dependencies("q", "p").failed) == [JobRef("q", "stolen")]


def test_a_raising_handler_retries_with_backoff_then_dies_and_fails_its_parent(redis_client):
    clock = Clock()
    mq = EchoMQ(redis_client, prefix="emq", clock=clock)
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[
                Flow("q", "t.echo", 1, job_id="ok"),
                Flow(
                    "q",
                    "t.fail",
                    {"message": "card declined"},
                    job_id="bad",
                    max_attempts=3,
                    backoff_ms=100,
                ),
            ],
        )
    )
    worker, processed = burst(mq, ["q"])
    assert processed == 2  # ok completed; bad failed once and waits in delayed
    bad = mq.get_job("q", "bad")
    assert (bad.state, bad.attempts) == (JobState.DELAYED, 1)
    assert mq.client.zscore(mq.keys.queue_key("q", "delayed"), "bad") == clock.now + 100
    for backoff in (100, 200):  # backoff_ms * 2**(attempt-1)
        clock.advance(backoff)
        assert mq.timers.promote_delayed("q") == 1
        assert worker.run(burst=True) == 1
    bad = mq.get_job("q", "bad")
    assert (bad.state, bad.attempts) == (JobState.DEAD, 3)
    lines = bad.error.splitlines()
    assert lines[0] == "ValueError: card declined"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: card declined"
    assert any("raise ValueError" in line for line in lines)
    parent = mq.get_job("q", "p")
    ref = JobRef("q", "bad")
    assert parent.state is JobState.DEAD
    assert parent.error == "failed by child q/bad: ValueError: card declined"  # its summary
    assert mq.dependencies("q", "p").failed == {ref: bad.error}
    assert worker.stats == {"completed": 1, "failed": 2, "dead": 1, "lost": 0, "postponed": 0}
    counts(mq, completed=1, dead=2)


def test_an_ignored_dead_child_lets_the_parent_run(mq):
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[
                Flow("q", "t.echo", 4, job_id="ok"),
                Flow(
                    "q",
                    "t.fail",
                    None,
                    job_id="bad",
                    max_attempts=2,
                    backoff_ms=0,
                    ignore_dependency_on_failure=True,
                ),
            ],
        )
    )
    _, processed = burst(mq, ["q"])
    assert processed == 4  # ok, bad twice, p
    bad = mq.get_job("q", "bad")
    assert (bad.state, bad.attempts) == (JobState.DEAD, 2)
    parent = mq.get_job("q", "p")
    assert (parent.state, parent.result) == (JobState.COMPLETED, 4)
    assert mq.ignored_failures("q", "p") == {JobRef("q", "bad"): bad.error}


def test_a_flaky_handler_completes_on_a_later_attempt(mq):
    mq.enqueue("q", "t.flaky", {"fail_times": 2}, job_id="f", max_attempts=3, backoff_ms=0)
    worker, processed = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "f")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, {"attempt": 3}, 3)
    assert (processed, worker.stats["failed"]) == (3, 2)


def test_an_unknown_job_name_fails_cleanly_and_the_worker_goes_on(mq, caplog):
    mq.enqueue("q", "t.nope", job_id="u", max_attempts=2, backoff_ms=0)
    mq.enqueue("q", "t.echo", "after", job_id="e")
    with caplog.at_level(logging.WARNING, "echomq_django.worker"):
        _, processed = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "u")
    assert (job.state, job.attempts) == (JobState.DEAD, 2)
    assert job.error == unknown_name_error("t.nope")
    assert job.error.startswith(
        "UnknownJobName: no handler is registered for job name 't.nope'; registered: "
    )
    # the closest names first, whatever else other tests registered
    import difflib

    from echomq_django.handlers import registered

    close = difflib.get_close_matches("t.nope", registered(), n=50, cutoff=0.5)
    listed = job.error.split("; registered: ")[1].split(", ")
    assert "t.echo" in close and listed[: len(close)] == close
    assert mq.get_job("q", "e").result == "after"
    assert processed == 3
    # one warning for the name, one for the death
    warnings = [r.getMessage() for r in caplog.records if r.name == "echomq_django.worker"]
    dead = f"job q/u (t.nope) is dead after 2 attempts: {job.error.splitlines()[0]}"
    assert warnings == [job.error, dead]


def test_a_worker_without_the_tasks_backend_says_so_for_a_task_job(mq, monkeypatch):
    """A worker started before the tasks framework was installed has no
    handler for ``@task`` jobs: the error says that, and the fix (restart),
    not "register a handler".
    docs/howto/tasks-backend.md"""
    from echomq_django import handlers

    monkeypatch.delitem(handlers._registry, "echomq_django.task")  # as if never loaded
    mq.enqueue("q", "echomq_django.task", {"task": "x.y"}, job_id="t", max_attempts=1)
    burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "t")
    assert (job.state, job.error) == (
        JobState.DEAD,
        "UnknownJobName: this worker has no handler for Django tasks (job name "
        "'echomq_django.task'): the tasks backend (echomq_django.tasks) was not loaded in "
        "this worker process, as no tasks framework was importable when it started; "
        f"{handlers.tasks_framework()} is importable now: restart this worker to load it",
    )
    assert handlers.tasks_framework() == (
        "django.tasks" if django.VERSION >= (6,) else "django_tasks"
    )
    monkeypatch.setattr("echomq_django.runners.pool.tasks_framework", lambda: None)
    assert unknown_name_error("echomq_django.task").endswith(
        "; install it (Django 5.2: pip install django-tasks; Django 6 has django.tasks), "
        "then restart this worker"
    )


def test_a_result_that_is_not_json_kills_the_job_at_once(mq):
    """Attempts left or not: another attempt would run the handler's side
    effects again for a result that still cannot be stored."""
    mq.enqueue("q", "t.bad_result", job_id="b", max_attempts=3)
    worker, _ = burst(mq, ["q"])
    job = mq.get_job("q", "b")
    assert (job.state, job.attempts) == (JobState.DEAD, 1)
    assert job.error == (
        "PayloadError: result is not JSON-serialisable: "
        "Object of type object is not JSON serializable"
    )
    assert worker.stats == {"completed": 0, "failed": 0, "dead": 1, "lost": 0, "postponed": 0}


def test_the_error_keeps_the_summary_and_the_last_traceback_lines(mq):
    mq.enqueue("q", "t.raise", 10, job_id="deep", max_attempts=1)
    burst(mq, ["q"])
    lines = mq.get_job("q", "deep").error.splitlines()
    assert len(lines) == 22
    assert lines[0] == "LookupError: deep down"
    assert lines[1].startswith("... (") and lines[1].endswith(" traceback lines trimmed)")
    assert lines[-1] == "LookupError: deep down"


def test_the_error_traceback_starts_at_the_handler(mq):
    """The worker's own call of the handler (the same frame in every job's
    error) is left out of the traceback: it starts at the handler."""
    mq.enqueue("q", "t.fail", {"message": "no"}, job_id="f", max_attempts=1)
    burst(mq, ["q"])
    lines = mq.get_job("q", "f").error.splitlines()
    assert lines[:2] == ["ValueError: no", "Traceback (most recent call last):"]
    assert lines[2].startswith('  File "') and lines[2].endswith(", in fail")
    assert lines[-1] == "ValueError: no"
    assert not [line for line in lines if "worker_loop.py" in line]


def _caller():
    _callee()


def _callee():
    raise KeyError("k")


def _frames(text: str) -> list[str]:
    """The function names of a traceback's frames, outermost first."""
    return [
        line.rsplit(", in ", 1)[-1] for line in text.splitlines() if line.startswith('  File "')
    ]


def test_error_text_below_its_caller_keeps_a_frame_that_raised_itself():
    this = "test_error_text_below_its_caller_keeps_a_frame_that_raised_itself"
    try:
        _caller()
    except KeyError as exc:
        below, whole = error_text(exc, below_caller=True), error_text(exc)
    assert (_frames(below), _frames(whole)) == (
        ["_caller", "_callee"],
        [this, "_caller", "_callee"],
    )
    try:
        raise KeyError("here")
    except KeyError as exc:
        assert _frames(error_text(exc, below_caller=True)) == [this]


def test_error_text_is_capped():
    text = error_text(ValueError("x" * 10_000))
    assert len(text) == 4000
    assert text.splitlines()[0] == "ValueError: " + "x" * 988


def test_max_jobs_bounds_a_run(mq):
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    worker = Worker(["q"], concurrency=2, mq=mq)
    assert worker.run(burst=True, max_jobs=3) == 3
    assert mq.job_ids("q", "pending") == ["j3", "j4"]
    assert worker.run(max_jobs=2) == 2  # not burst: max_jobs alone ends it
    assert worker.processed == 5


def test_queues_are_served_round_robin(mq):
    for q in ("a", "b"):
        for i in range(3):
            mq.enqueue(q, "t.record", f"{q}{i}")
    from tests.support.workerapp.jobs import RECORDED

    RECORDED.clear()
    burst(mq, ["a", "b"], concurrency=1)  # one thread: it runs them in claim order
    assert RECORDED == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_lost_lease_drops_the_result_and_the_job_runs_again(mq, caplog):
    mq.enqueue("q", "t.lose_lease", job_id="l")
    with caplog.at_level(logging.WARNING, "echomq_django.worker"):
        worker, processed = burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "l")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 2, 2)
    assert worker.stats == {"completed": 1, "failed": 0, "dead": 0, "lost": 1, "postponed": 0}
    assert processed == 1
    [warning] = [r.getMessage() for r in caplog.records if r.name == "echomq_django.worker"]
    # Pending again (recovered), or already claimed again by this worker's loop:
    assert warning in {
        "job q/l (t.lose_lease): result dropped, the lease was lost: job 'l' in queue 'q' is "
        "pending",
        "job q/l (t.lose_lease): result dropped, the lease was lost: job 'l' in queue 'q': lease "
        "token is stale (the lease expired and the job was recovered or claimed again)",
    }


def test_the_heartbeat_keeps_a_long_job_leased(r):
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.slow", 1.0, job_id="s")
    worker = Worker(["q"], mq=mq, lease_ms=400, heartbeat_ms=40)
    bg = Background(worker, burst=True)
    wait_for(lambda: mq.get_job("q", "s").state is JobState.ACTIVE, what="claim")
    time.sleep(0.7)  # well past the 400 ms lease
    report = Pump(["q"], mq=mq).sweep()["q"]
    assert report["recovered"] == 0
    assert bg.join() == 1
    job = mq.get_job("q", "s")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 1.0, 1)


def test_a_reporter_in_an_outage_holds_claims_and_the_heartbeat_keeps_every_lease(r, monkeypatch):
    """While the reporter's batches meet an outage the loop claims nothing new (the jobs it
    holds stop growing), and the heartbeat extends all their leases, a beat's due jobs in one
    call: none is recovered, none runs twice. The loop claimed all 60 before."""
    mq = EchoMQ(r, prefix="emq")
    for i in range(60):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    worker = Worker(["q"], mq=mq, concurrency=10, lease_ms=600, heartbeat_ms=100)
    reporter, down, report, beats = worker.loop.reporter, threading.Event(), None, []
    report, extend = reporter.report, mq.extend_leases

    def failing(items):
        if down.is_set():
            raise RedisUnavailable("Redis is unreachable at the test's fault")
        report(items)

    down.set()
    monkeypatch.setattr(reporter, "report", failing)
    monkeypatch.setattr(
        mq, "extend_leases", lambda jobs, ms: beats.append(len(jobs)) or extend(jobs, ms)
    )
    bg = Background(worker, burst=True)
    wait_for(lambda: reporter.down, what="the reporter's outage")
    time.sleep(0.2)  # a claim the loop sent before the outage was seen lands first
    held = len(worker.loop.claims)
    time.sleep(1.5)  # two and a half leases
    assert len(worker.loop.claims) == held < 60
    assert (r.zcard("emq:{q}:active"), r.llen("emq:{q}:pending")) == (held, 60 - held)
    assert Pump(["q"], mq=mq).sweep()["q"]["recovered"] == 0
    assert beats and max(beats) <= held <= sum(beats)
    down.clear()
    assert bg.join() == 60
    jobs = [mq.get_job("q", f"j{i}") for i in range(60)]
    assert {(job.state, job.attempts) for job in jobs} == {(JobState.COMPLETED, 1)}
    assert [job.result for job in jobs] == list(range(60))


def test_a_heartbeat_that_meets_an_outage_tries_again_within_the_beat(r, monkeypatch):
    """A beat refused for an outage is tried again 50 ms later, then 100 ms, not a whole beat
    later: a beat of 1 s, a lease of 1.5 s and the first two tries refused, the third extends
    the lease before it ends. A beat later it had ended, and the job ran twice."""
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.slow", 2.0, job_id="s")
    worker = Worker(["q"], mq=mq, lease_ms=1500, heartbeat_ms=1000)
    calls, extend = [], mq.extend_leases

    def flaky(jobs, ms):
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise RedisUnavailable("Redis is unreachable at the test's fault")
        return extend(jobs, ms)

    monkeypatch.setattr(mq, "extend_leases", flaky)
    assert Background(worker, burst=True).join() == 1
    job = mq.get_job("q", "s")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 2.0, 1)
    assert worker.stats["lost"] == 0
    gaps = [calls[1] - calls[0], calls[2] - calls[1]]
    assert 0.04 <= gaps[0] <= 0.4 and 0.09 <= gaps[1] <= 0.5, gaps


def test_stop_finishes_running_jobs(r):
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.slow", 0.3, job_id="s")
    mq.enqueue("q", "t.echo", 1, job_id="later")
    worker = Worker(["q"], concurrency=1, mq=mq)
    bg = Background(worker)
    wait_for(lambda: mq.get_job("q", "s").state is JobState.ACTIVE, what="claim")
    worker.stop()
    assert bg.join() == 1
    assert mq.get_job("q", "s").state is JobState.COMPLETED
    assert mq.get_job("q", "later").state is JobState.PENDING
    assert worker.abandoned == 0


def test_stop_force_leaves_the_running_job_to_its_lease(r):
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.slow", 1.0, job_id="s")
    worker = Worker(["q"], concurrency=1, mq=mq)
    bg = Background(worker)
    wait_for(lambda: mq.get_job("q", "s").state is JobState.ACTIVE, what="claim")
    worker.stop(force=True)
    assert bg.join() == 0
    assert worker.abandoned == 1
    assert mq.get_job("q", "s").state is JobState.ACTIVE  # until the lease expires


def test_a_graceful_stop_gives_up_after_the_shutdown_timeout(r):
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.slow", 1.0, job_id="s")
    worker = Worker(["q"], concurrency=1, mq=mq, shutdown_timeout=0)
    bg = Background(worker)
    wait_for(lambda: mq.get_job("q", "s").state is JobState.ACTIVE, what="claim")
    worker.stop()
    assert bg.join() == 0
    assert worker.abandoned == 1


def test_bad_arguments_are_refused(mq):
    for kwargs, message in [
        ({"queues": []}, "a worker needs at least one queue"),
        ({"queues": ["a b"]}, None),
        ({"queues": ["q"], "concurrency": 0}, "concurrency must be an integer >= 1, got 0"),
        (
            {"queues": ["q"], "lease_ms": 0},
            "lease_ms must be an integer from 1 to 31,536,000,000, got 0",
        ),
        (
            {"queues": ["q"], "lease_ms": 2**63},
            "lease_ms must be an integer from 1 to 31,536,000,000, got 9223372036854775808",
        ),
        (
            {"queues": ["q"], "shutdown_timeout": -5},
            "shutdown_timeout must be finite, >= 0 s, got -5",
        ),
        ({"queues": ["q"], "block_timeout": 0}, "block_timeout must be finite, > 0 s, got 0"),
        (
            {"queues": ["q"], "block_timeout": float("nan")},
            "block_timeout must be finite, > 0 s, got nan",
        ),
        (
            {"queues": ["q"], "shutdown_timeout": float("inf")},
            "shutdown_timeout must be finite, >= 0 s, got inf",
        ),
        (
            {"queues": ["q"], "sweep_interval": float("inf")},
            "sweep_s must be a finite number > 0 s, got inf",
        ),
    ]:
        with pytest.raises(ValueError) as err:
            Worker(mq=mq, **kwargs)
        if message:
            assert str(err.value) == message


# -- Redis going away ---------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_retry_client(port: int) -> redis.Redis:
    # redis-py retries a refused connection itself, with its own backoff;
    # these tests watch the worker's.
    return redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))


def test_unreachable_redis_is_retried_with_backoff(caplog):
    port = closed_port()
    mq = EchoMQ(no_retry_client(port), prefix="emq")
    worker = Worker(["q"], mq=mq)
    with caplog.at_level(logging.WARNING, "echomq_django.worker"):
        bg = Background(worker, burst=True)
        wait_for(
            lambda: sum("retrying in" in r.getMessage() for r in caplog.records) >= 2,
            what="two retries",
        )
        worker.stop()
        assert bg.join() == 0
    lines = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    where = f"Redis unreachable at redis://127.0.0.1:{port}/0 (Error 111 connecting to "
    for line, delay in zip(lines[:2], ("0.5s", "1.0s"), strict=False):
        assert line.startswith(where)
        assert line.endswith(f"Connection refused.), retrying in {delay}")
    assert not any("reachable again" in r.getMessage() for r in caplog.records)


class Proxy:
    """A TCP proxy to Redis that the test can cut and restore: ``cut()``
    closes every connection and refuses new ones until ``restore()``."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.up = threading.Event()
        self.up.set()
        self.conns: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        for s in self.conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.conns = []

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_a_job_held_through_an_outage_is_reported_when_redis_returns(r, caplog):
    direct = EchoMQ(r, prefix="emq")
    direct.enqueue("q", "t.slow", 0.5, job_id="s")
    proxy = Proxy(r.connection_pool.connection_kwargs["port"])
    try:
        mq = EchoMQ(no_retry_client(proxy.port), prefix="emq")
        worker = Worker(["q"], concurrency=1, mq=mq)
        with caplog.at_level(logging.WARNING, "echomq_django.worker"):
            bg = Background(worker)
            wait_for(lambda: direct.get_job("q", "s").state is JobState.ACTIVE, what="claim")
            proxy.cut()
            wait_for(
                lambda: any("retrying in" in x.getMessage() for x in caplog.records),
                what="the outage warning",
            )
            assert direct.get_job("q", "s").state is JobState.ACTIVE
            proxy.restore()
            wait_for(
                lambda: direct.get_job("q", "s").state is JobState.COMPLETED,
                what="the report after the outage",
            )
            worker.stop()
            assert bg.join() == 1
    finally:
        proxy.close()
    job = direct.get_job("q", "s")
    assert (job.result, job.attempts) == (0.5, 1)
    assert worker.stats == {"completed": 1, "failed": 0, "dead": 0, "lost": 0, "postponed": 0}
    messages = [x.getMessage() for x in caplog.records]
    assert f"Redis reachable again at redis://127.0.0.1:{proxy.port}/0" in messages


def test_error_text_survives_an_exception_whose_str_raises():
    class Weird(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert error_text(Weird()) == "Weird: (could not format the error: RuntimeError)"


@pytest.mark.parametrize("released_meanwhile", [False, True], ids=["quiet", "released"])
def test_a_short_claim_rests_its_queue_unless_a_parent_was_released_meanwhile(
    mq, released_meanwhile
):
    # The reporter thread may release a parent while the loop's claim is in
    # flight: resting the queue then would leave the parent waiting out the
    # whole poll_interval (the benchmark saw roots wait 50 ms).
    worker = Worker(["q"], concurrency=2, mq=mq, poll_interval=60)
    real = mq.claim

    def claim(queue, count, lease_ms=None, token=None, yields_to=None):
        jobs = real(queue, count, lease_ms, token, yields_to)  # the queue is empty: a short claim
        if released_meanwhile:
            child = SimpleNamespace(queue=queue, id="c")
            worker.loop.reporter._after(child, Outcome(released=[(queue, "p")]))  # as it does
        return jobs

    mq.claim = claim
    assert worker.loop._claim(2, everywhere=False) == 0
    assert (worker.loop.rest["q"] == 0.0) is released_meanwhile


# -- a claim whose reply was lost ----------------------------------------------


def lose_first_reply_on(mq, monkeypatch, lost_queue):
    """mq.claim runs for real; its first call on ``lost_queue`` raises after
    Redis ran it (the reply lost)."""
    real, calls = mq.claim, []

    def claim(queue, count=1, lease_ms=None, token=None, yields_to=None):
        calls.append((queue, count, token))
        jobs = real(queue, count, lease_ms, token=token, yields_to=yields_to)
        if queue == lost_queue and sum(q == lost_queue for q, _, _ in calls) == 1:
            raise RedisUnavailable("Redis is unreachable: reply lost")  # what claim raises
        return jobs

    monkeypatch.setattr(mq, "claim", claim)
    return calls


def test_max_jobs_holds_when_one_queue_s_claim_raises(mq, monkeypatch) -> None:
    """Worker(queues=[a, b]).run(max_jobs=2): a's claim gives 1 job, b's claim
    (1 job leased) loses its reply. The replay gives b's job back; the run
    must still claim no more than 2 jobs in all."""
    mq.enqueue("a", "t.echo", "a0", job_id="a0")
    for i in range(5):
        mq.enqueue("b", "t.echo", f"b{i}", job_id=f"b{i}")
    calls = lose_first_reply_on(mq, monkeypatch, "b")
    worker = Worker(["a", "b"], concurrency=4, mq=mq)
    done = worker.run(max_jobs=2)
    completed = mq.counts("a")["completed"] + mq.counts("b")["completed"]
    assert (done, completed) == (2, 2), calls
