"""``async def`` handlers (echomq_django.handlers): they register, run on the
worker's handler threads through ``async_to_sync`` and report like sync ones,
on both rigs."""

from __future__ import annotations

import inspect

import pytest

from echomq_django import JobState, handler
from echomq_django.handlers import get_handler
from tests.support.workerapp import jobs
from tests.support.workerkit import burst


def test_the_decorator_returns_the_coroutine_function_and_registers_a_sync_one():
    assert inspect.iscoroutinefunction(jobs.async_echo)
    registered = get_handler("t.async_echo")
    assert not inspect.iscoroutinefunction(registered)
    assert registered.__wrapped__ is jobs.async_echo
    # registering the same function again (a re-import) is not a conflict
    assert handler("t.async_echo")(jobs.async_echo) is jobs.async_echo
    with pytest.raises(ValueError, match="already has a handler"):
        handler("t.async_echo")(jobs.echo)


def test_async_handlers_complete_and_fail_like_sync_ones(mq):
    for i in range(3):
        mq.enqueue("q", "t.async_echo", {"n": i}, job_id=f"ok{i}")
    mq.enqueue("q", "t.async_fail", None, job_id="bad", max_attempts=1)
    worker, processed = burst(mq, ["q"], concurrency=2)
    assert processed == 4
    assert worker.stats == {"completed": 3, "failed": 0, "dead": 1, "lost": 0, "postponed": 0}
    results = [mq.get_job("q", f"ok{i}").result for i in range(3)]
    assert results == [{"echo": {"n": i}} for i in range(3)]
    bad = mq.get_job("q", "bad")
    assert bad.state is JobState.DEAD
    assert bad.error.startswith("ValueError: async boom\n")
    assert bad.error.endswith('raise ValueError("async boom")\nValueError: async boom')


def test_the_async_orm_is_served_by_the_handler_thread(r, transactional_db):
    from django.contrib.auth.models import User

    from echomq_django import EchoMQ

    User.objects.create(username="a")
    mq = EchoMQ(r)
    mq.enqueue("q", "t.async_orm", None, job_id="orm")
    burst(mq, ["q"], concurrency=1)
    job = mq.get_job("q", "orm")
    assert job.state is JobState.COMPLETED, job.error
    assert job.result["users"] == 1
    # the coroutine ran on asgiref's loop thread, not on the handler thread
    assert not job.result["thread"].startswith("echomq-worker")
