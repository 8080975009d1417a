"""Django's tasks framework on our queue (echomq_django.tasks). The cases of
the framework's own backend tests (Django's tests/tasks, the backport's
Redis-backed backend tests): enqueue, aenqueue, get_result, refresh, statuses,
errors, takes_context, async tasks, queue names, run_after, priority,
transactions, signals, checks."""

from __future__ import annotations

import itertools
import logging
import os
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from echomq_django import JobState, Worker, conf
from tests.support.workerkit import run_async

# Django 5.2 without the backport has no tasks framework: nothing to test.
tasks_mod = pytest.importorskip("tests.support.workerapp.tasks")

from echomq_django.tasks import (  # noqa: E402
    TASK_JOB_NAME,
    WORKER_ID,
    EchoMQBackend,
    InvalidTask,
    run_task,
    task_error,
)

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

    FRAMEWORK_LOGGER = "django.tasks"
except ImportError:
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

    FRAMEWORK_LOGGER = "django_tasks"

QUEUES = ["default", "tasks-other"]


@pytest.fixture(params=["single", "cluster"])
def smq(request, monkeypatch):
    """The settings' EchoMQ (what the backend uses) on the test's rig."""
    if request.param == "single":
        request.getfixturevalue("r")
        override = override_settings()
    else:
        cluster = request.getfixturevalue("redis_cluster")
        request.getfixturevalue("rc")
        monkeypatch.setenv("ECHOMQ_URL", cluster.url)
        override = override_settings(ECHOMQ={"URL": cluster.url, "CLUSTER": True})
    conf.reset()
    with override:
        yield conf.get_mq()
    conf.reset()


@pytest.fixture
def mq(r):
    """The settings' EchoMQ on the single server (backend-only tests)."""
    conf.reset()
    yield conf.get_mq()
    conf.reset()


def run_worker(mq, pool: str = "thread") -> int:
    return Worker(QUEUES, concurrency=2, mq=mq, pool=pool).run(burst=True)


def test_the_backend_is_ours():
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], EchoMQBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.queues == set(QUEUES)
    assert (default_task_backend.max_attempts, default_task_backend.on_commit) == (1, None)
    assert default_task_backend.supports_async_task and default_task_backend.supports_defer
    assert default_task_backend.supports_get_result
    assert list(default_task_backend.check()) == []


@pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
def test_enqueue_lands_one_job_and_answers_ready(mq, name):
    task = getattr(tasks_mod, name)
    result = task.enqueue(1, two=3)
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert (result.task, result.args, result.kwargs, result.attempts) == (task, [1], {"two": 3}, 0)
    job = mq.get_job("default", result.id)
    assert (job.name, job.state, job.max_attempts) == (TASK_JOB_NAME, JobState.PENDING, 1)
    assert job.payload == {
        "task": f"tests.support.workerapp.tasks.{name}",
        "args": [1],
        "kwargs": {"two": 3},
    }


def test_aenqueue_and_aget_result(mq):
    result = run_async(tasks_mod.noop_task_async.aenqueue)
    assert (result.status, result.args, result.kwargs) == (TaskResultStatus.READY, [], {})
    assert run_async(default_task_backend.aget_result, result.id) == result


def test_get_result_equals_the_enqueued_result(mq):
    result = default_task_backend.enqueue(tasks_mod.noop_task, (), {})
    assert default_task_backend.get_result(result.id) == result
    assert tasks_mod.noop_task.get_result(result.id) == result
    with pytest.raises(TaskResultMismatch):
        tasks_mod.calculate_meaning_of_life.get_result(result.id)


def test_refresh_after_a_run(smq):
    result = tasks_mod.calculate_meaning_of_life.enqueue()
    assert run_worker(smq) == 1
    assert result.status == TaskResultStatus.READY  # a result is a snapshot
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished and result.return_value == 42
    assert result.attempts == 1 and result.worker_ids == [WORKER_ID]
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at
    run_async(result.arefresh)
    assert result.return_value == 42


@pytest.mark.parametrize("pool", ["thread", "async"])
def test_async_task_runs_on_the_worker(smq, pool):
    """On the async pool too: the backend's sync handler, on a slot thread
    (docs/howto/async-handlers.md#from-async-code)."""
    result = tasks_mod.async_add.enqueue(2, b=3)
    run_worker(smq, pool)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


@pytest.mark.parametrize(
    "name,exc_path,message",
    [
        ("failing_task_value_error", "builtins.ValueError", "This task failed due to ValueError"),
        ("failing_task_system_exit", "builtins.SystemExit", "This task failed due to SystemExit"),
    ],
)
def test_a_failing_task_is_failed_with_its_error(mq, name, exc_path, message):
    result = getattr(tasks_mod, name).enqueue()
    run_worker(mq)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.started_at <= result.finished_at and result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == exc_path
    assert error.exception_class.__name__ == exc_path.split(".")[-1]
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith(f"{exc_path.split('.')[-1]}: {message}\n")


def test_a_task_exception_keeps_its_class_path(mq):
    result = tasks_mod.failing_task_custom.enqueue()
    run_worker(mq)
    result.refresh()
    [error] = result.errors
    assert error.exception_class is tasks_mod.CustomError
    assert error.traceback.endswith(
        "tests.support.workerapp.tasks.CustomError: custom\nand a second line\n"
    )


def test_complex_exception_and_return_value(mq):
    exc = tasks_mod.complex_exception.enqueue()
    ret = tasks_mod.complex_return_value.enqueue()
    run_worker(mq)
    exc.refresh()
    ret.refresh()
    assert exc.status == ret.status == TaskResultStatus.FAILED
    assert exc.errors[0].exception_class is ValueError
    assert "ValueError: This task failed" in exc.errors[0].traceback
    assert ret.errors[0].exception_class_path == "echomq_django.core.exceptions.PayloadError"
    assert "result is not JSON-serialisable" in ret.errors[0].traceback


def test_missing_and_foreign_ids(mq, transactional_db):
    for bad in ("123", "a:b", "has space", "x" * 200):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)
    with pytest.raises(TaskResultDoesNotExist):
        run_async(default_task_backend.aget_result, "123")
    mq.enqueue("default", "t.echo", 1, job_id="plain")
    with pytest.raises(TaskResultDoesNotExist, match="is not a task"):
        default_task_backend.get_result("plain")


def test_takes_context(mq):
    ids = tasks_mod.get_task_id.enqueue()
    ctx = tasks_mod.check_context.enqueue(1)
    run_worker(mq)
    ids.refresh()
    ctx.refresh()
    assert ids.return_value == ids.id
    assert ctx.return_value == {"attempt": 1, "status": "RUNNING"}


def test_queue_names_map_to_our_queues(mq):
    here = tasks_mod.noop_task.enqueue()
    there = tasks_mod.noop_task.using(queue_name="tasks-other").enqueue()
    declared = tasks_mod.other_queue_task.enqueue(7)
    assert mq.job_ids("default", "pending") == [here.id]
    assert mq.job_ids("tasks-other", "pending") == [there.id, declared.id]
    assert default_task_backend.get_result(there.id).task.queue_name == "tasks-other"
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid for backend"):
        tasks_mod.noop_task.using(queue_name="elsewhere")
    run_worker(mq)
    declared.refresh()
    assert declared.return_value == {"x": 7}


def test_a_queue_name_our_queue_refuses_is_invalid_task(r):
    tasks = {"default": {"BACKEND": "echomq_django.tasks.EchoMQBackend", "QUEUES": ["a b"]}}
    with override_settings(TASKS=tasks):
        with pytest.raises(InvalidTask, match="invalid queue name 'a b'"):
            tasks_mod.noop_task.using(queue_name="a b")
        assert [e.id for e in task_backends["default"].check()] == ["echomq_django.E031"]


def test_run_after_holds_the_job_in_delayed(mq):
    when = timezone.now() + timedelta(hours=1)
    result = tasks_mod.noop_task.using(run_after=when).enqueue()
    job = mq.get_job("default", result.id)
    assert job.state is JobState.DELAYED
    due = mq.client.zscore(mq.keys.queue_key("default", "delayed"), result.id)
    assert int(due) == int(when.timestamp() * 1000)
    again = default_task_backend.get_result(result.id)
    assert again.status == TaskResultStatus.READY and again.task.run_after == when
    assert run_worker(mq) == 0


def test_priority_is_mapped_or_refused(mq):
    if EchoMQBackend.supports_priority:
        result = tasks_mod.noop_task.using(priority=5).enqueue()
        assert default_task_backend.get_result(result.id).task.priority == 5
        with pytest.raises(InvalidTask, match="priority must be a whole number between"):
            tasks_mod.noop_task.using(priority=101)
    else:
        with pytest.raises(InvalidTask, match="does not support setting priority"):
            tasks_mod.noop_task.using(priority=5)


def test_a_local_function_is_refused(r):
    try:
        from django.tasks import task
    except ImportError:
        from django_tasks import task

    def local():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local)


def test_inside_a_transaction_it_waits_for_the_commit(mq, transactional_db):
    with transaction.atomic():
        result = tasks_mod.noop_task.enqueue()
        assert result.enqueued_at is None
        assert mq.client.keys("*") == []
        result.refresh()  # read from the outbox row, which this transaction sees
        assert (result.status, result.enqueued_at) == (TaskResultStatus.READY, None)
        assert result.task == tasks_mod.noop_task
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.enqueued_at is not None

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        gone = tasks_mod.noop_task.enqueue()
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(gone.id)


def test_retries_follow_the_queue_when_max_attempts_is_none(mq):
    tasks = {
        "default": {
            "BACKEND": "echomq_django.tasks.EchoMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"MAX_ATTEMPTS": None},
        }
    }
    with override_settings(TASKS=tasks):
        result = tasks_mod.failing_task_value_error.enqueue()
        Worker(["default"], mq=mq).run(burst=True)
        result.refresh()
    # the queue default is 3 attempts: this one waits out its backoff
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 1)
    assert result.errors[0].exception_class is ValueError and result.finished_at is None


def test_signals_log_enqueued_started_finished(mq, caplog):
    with caplog.at_level(logging.DEBUG, logger=FRAMEWORK_LOGGER):
        ok = tasks_mod.noop_task.enqueue()
        bad = tasks_mod.failing_task_value_error.enqueue()
        run_worker(mq)
    lines = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK_LOGGER]
    assert sum("enqueued" in line for line in lines) == 2
    for result, end in ((ok, "SUCCESSFUL"), (bad, "FAILED")):
        mine = [line for line in lines if result.id in line and "enqueued" not in line]
        assert [line.rsplit("state=", 1)[1] for line in mine] == ["RUNNING", end]


@pytest.mark.parametrize(
    "params,expected",
    [
        ({"QUEUES": []}, ["echomq_django.E030"]),
        ({"QUEUES": ["ok", "no{pe}"]}, ["echomq_django.E031"]),
        ({"OPTIONS": {"RETRIES": 1}}, ["echomq_django.E032"]),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, ["echomq_django.E032"]),
        ({"OPTIONS": {"ON_COMMIT": "yes"}}, ["echomq_django.E032"]),
        ({"OPTIONS": {"MAX_ATTEMPTS": None, "ON_COMMIT": True}}, []),
    ],
)
def test_backend_checks(params, expected):
    backend = EchoMQBackend("x", {"QUEUES": ["default"], **params})
    assert [e.id for e in backend.check()] == expected


def test_task_error_from_an_error_text_without_a_traceback():
    err = task_error("UnknownJobName: no handler")
    assert (err.exception_class_path, err.traceback) == (
        "builtins.Exception",
        "UnknownJobName: no handler\n",
    )
    assert task_error("KeyError: 'x'").exception_class is KeyError


def test_a_deferred_task_keeps_its_priority(mq, transactional_db):
    assert EchoMQBackend.supports_priority
    with transaction.atomic():
        result = tasks_mod.noop_task.using(priority=7).enqueue()
    assert default_task_backend.get_result(result.id).task.priority == 7
    assert mq.get_job("default", result.id).state is JobState.PENDING


# -- TaskResult through retries (docs/howto/tasks-backend.md#taskresult-fields) ----------
def retrying(attempts: int):
    """TASKS allowing ``attempts`` tries, and a default queue with no backoff:
    a failed attempt goes straight back to pending, where a burst finds it."""
    tasks = {
        "default": {
            "BACKEND": "echomq_django.tasks.EchoMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"MAX_ATTEMPTS": attempts},
        }
    }
    cfg = {"URL": os.environ["ECHOMQ_URL"], "QUEUES": {"default": {"BACKOFF_MS": 0}}}
    return override_settings(TASKS=tasks, ECHOMQ=cfg)


def test_a_result_through_retries_keeps_each_attempt_s_error_and_its_first_start(r):
    with retrying(3):
        conf.reset()
        mq = conf.get_mq()
        ticks = itertools.count(1_800_000_000_000, 10)  # ms: each reading 10 ms later
        mq.clock = lambda: next(ticks)
        result = tasks_mod.fails_twice.enqueue()
        (job,) = mq.claim("default")  # attempt 1, run by hand
        with pytest.raises(tasks_mod.CustomError):
            run_task(job)
        mq.fail(job, "tests.support.workerapp.tasks.CustomError: attempt 1 failed")
        result.refresh()
        assert (result.status, result.attempts, len(result.errors)) == (
            TaskResultStatus.READY,
            1,
            1,
        )
        assert result.started_at == result.last_attempted_at
        started = result.started_at
        assert Worker(["default"], mq=mq, concurrency=1).run(burst=True) == 2
        result.refresh()
        conf.reset()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3 and result.worker_ids == [WORKER_ID] * 3
    assert result.started_at == started < result.last_attempted_at <= result.finished_at
    assert [e.exception_class for e in result.errors] == [tasks_mod.CustomError] * 2
    assert result.errors[1].traceback.rstrip().endswith("attempt 2 failed")
    assert result.return_value == {
        "attempt": 3,
        "errors": [f"{tasks_mod.CustomError.__module__}.CustomError"] * 2,
        "first_is_earlier": True,
    }
    assert (mq.get_job("default", result.id).progress, mq.job_logs("default", result.id)) == (
        100,
        ["third time lucky"],
    )


def test_enqueue_leaves_the_process_clock_running(mq):
    ticks = itertools.count(1_800_000_000_000, 10)
    mq.clock = lambda: next(ticks)
    result = tasks_mod.noop_task.enqueue()
    assert result.enqueued_at.timestamp() * 1000 == 1_800_000_000_000
    assert mq.clock() == 1_800_000_000_010  # not pinned to the enqueue's time


def test_a_failed_result_has_one_error_per_attempt_and_refreshes_async(r):
    with retrying(2):
        conf.reset()
        mq = conf.get_mq()
        ticks = itertools.count(1_800_000_000_000, 10)
        mq.clock = lambda: next(ticks)
        result = tasks_mod.failing_task_value_error.enqueue()
        assert Worker(["default"], mq=mq, concurrency=1).run(burst=True) == 2
        run_async(result.arefresh)
        conf.reset()
    assert (result.status, result.attempts, result.is_finished) == (
        TaskResultStatus.FAILED,
        2,
        True,
    )
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
    assert result.started_at < result.last_attempted_at <= result.finished_at


def test_the_errors_kept_are_bounded(mq):
    from echomq_django.protocol.reads import ERRORS_KEPT

    mq.enqueue("default", "t.fail", None, job_id="many", max_attempts=ERRORS_KEPT + 5)
    for n in range(ERRORS_KEPT + 5):
        mq.client.hset(mq.keys.job("default", "many"), "s", "pending")
        mq.client.rpush(mq.keys.queue("default").pending, "many")
        (job,) = mq.claim("default")
        mq.fail(job, f"boom {n}")
        mq.client.zrem(mq.keys.queue("default").delayed, "many")
    errors = mq.attempt_errors("default", "many")
    assert errors == [f"boom {n}" for n in range(5, ERRORS_KEPT + 5)]
    assert mq.client.llen(mq.keys.job_keys("default", "many").errors) == ERRORS_KEPT - 1
    mq.remove("default", "many")
    assert mq.client.exists(mq.keys.job_keys("default", "many").errors) == 0
