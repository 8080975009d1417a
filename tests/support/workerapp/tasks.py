"""``@task`` functions for the tasks-backend tests (echomq_django.tasks), the
cases Django's own backend tests use."""

from __future__ import annotations

import asyncio

try:
    from django.tasks import TaskContext, task
except ImportError:
    from django_tasks import TaskContext, task


class CustomError(Exception):
    """A task's own exception class: its path survives the trip through Redis."""


@task
def noop_task(*args, **kwargs):
    return None


@task
async def noop_task_async(*args, **kwargs):
    return None


@task
def calculate_meaning_of_life():
    return 42


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task
def failing_task_value_error():
    raise ValueError("This task failed due to ValueError")


@task
def failing_task_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task
def failing_task_custom():
    raise CustomError("custom\nand a second line")


@task
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task
def complex_return_value():
    return object()


@task(takes_context=True)
def get_task_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return {"attempt": context.attempt, "status": str(context.task_result.status)}


@task(queue_name="tasks-other")
def other_queue_task(x):
    return {"x": x}


@task(takes_context=True)
def fails_twice(context):
    """Fails on attempts 1 and 2, then reports through current_job() and
    answers what its context said on the attempt that succeeded."""
    from echomq_django import current_job

    if context.attempt < 3:
        raise CustomError(f"attempt {context.attempt} failed")
    job = current_job()
    job.log("third time lucky")
    job.report_progress(100)
    result = context.task_result
    return {
        "attempt": context.attempt,
        "errors": [str(e.exception_class_path) for e in result.errors],
        "first_is_earlier": result.started_at < result.last_attempted_at,
    }
