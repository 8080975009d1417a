"""A backend for Django's tasks framework
(docs/explanation/house.md#the-root-djangos-conventional-files).

``django.tasks`` on Django 6, the ``django_tasks`` backport on Django 5.2
(preferred in that order). Settings::

    TASKS = {
        "default": {
            "BACKEND": "echomq_django.tasks.EchoMQBackend",
            "QUEUES": ["default", "emails"],     # our queue names, one per queue_name
            "OPTIONS": {"MAX_ATTEMPTS": 1, "ON_COMMIT": None},
        }
    }

A ``@task`` function is enqueued as one job named ``echomq_django.task``
(``TASK_JOB_NAME``) on the queue named by its ``queue_name``, with the payload
``{"task": "<module path>", "args": [...], "kwargs": {...}}`` (plus
``priority`` and ``run_after`` when set). That one handler, registered here,
resolves the task by its module path and runs it (``Task.call``: an ``async
def`` task runs through asgiref's ``async_to_sync``, as handlers do).
``TaskResult.id`` is the job id, so the admin finds it by id.

Mapping (``get_result`` / ``TaskResult.refresh``): ``pending``, ``delayed``
(``run_after``, or waiting out a retry's backoff) and ``awaiting_children`` are
READY; ``active`` is RUNNING; ``completed`` is SUCCESSFUL; ``dead`` is FAILED:
a failed attempt with attempts left goes back to READY, not FAILED.
``started_at`` is the first attempt's start and ``last_attempted_at`` the
latest one's; ``errors`` holds one ``TaskError`` per failed attempt, oldest
first, the newest ten (``EchoMQ.attempt_errors``); ``worker_ids`` holds one
entry per attempt started, the running one included, as the framework's
own backends count (``WORKER_ID``: the queue does not record which worker
ran an attempt), so ``attempts`` counts them and ``TaskContext.attempt``
starts at 1. ``TaskResult.refresh()`` / ``arefresh()`` read it all again;
to block until a task finishes, ``emq.wait(queue_name, result.id, timeout_s)``
(docs/howto/tasks-backend.md#taskresult-fields).
``run_after`` maps to ``delay_ms``; ``priority`` to the job's priority
(docs/explanation/protocol.md#scheduling; ``supports_priority`` follows whether ``EchoMQ.enqueue``
takes one, and without it a non-zero priority is the framework's
``InvalidTask``).

OPTIONS: ``MAX_ATTEMPTS`` (int >= 1, or None for the queue's ``MAX_ATTEMPTS``;
default 1: a task runs once, as the framework's own backends do) and
``ON_COMMIT`` (None: inside an atomic block the job lands after the commit,
as ``echomq_django.enqueue`` does; True / False: always / never wait).
"""

from __future__ import annotations

import copy
import inspect
import re
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core import checks
from django.utils import timezone
from django.utils.module_loading import import_string

try:  # Django >= 6.0
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

from . import commit_outbox as outbox
from .api import adds as api
from .conf import get_mq
from .core.exceptions import JobNotFound, Unrecoverable
from .core.flows import new_id
from .core.jobs import Job, JobState
from .core.keyspace import validate_id, validate_queue
from .core.live import running, stop_running
from .handlers import TASK_JOB_NAME, handler
from .protocol.client import EchoMQ

__all__ = ["TASK_JOB_NAME", "WORKER_ID", "EchoMQBackend", "InvalidTask"]

WORKER_ID = "echomq_django"
OPTION_KEYS = {"MAX_ATTEMPTS", "ON_COMMIT"}

STATUS = {
    JobState.PENDING: TaskResultStatus.READY,
    JobState.DELAYED: TaskResultStatus.READY,
    JobState.AWAITING_CHILDREN: TaskResultStatus.READY,
    JobState.ACTIVE: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.DEAD: TaskResultStatus.FAILED,
}


def _accepts(method, name: str) -> bool:
    return name in inspect.signature(method).parameters


def _when(ms: int | None) -> datetime | None:
    """ms since the epoch as ``timezone.now()`` would give it: aware UTC with
    USE_TZ, naive local time without."""
    if ms is None:
        return None
    if settings.USE_TZ:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    return datetime.fromtimestamp(ms / 1000)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class EchoMQBackend(BaseTaskBackend):
    """Runs ``@task`` functions as echomq_django jobs.

    ``params``: the ``TASKS`` entry: ``QUEUES`` (list of queue names, each a
    valid echomq queue name, at least one) and ``OPTIONS`` (see the module
    docstring). Nothing here touches Redis until ``enqueue`` / ``get_result``.
    Raises ``InvalidTask`` (the framework's error) for a task this backend
    cannot run; ``TaskResultDoesNotExist`` from ``get_result`` for an unknown
    id; ``RedisUnavailable`` when Redis cannot be reached.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = _accepts(EchoMQ.enqueue, "priority")

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        options = self.options if isinstance(self.options, dict) else {}
        self.max_attempts = options.get("MAX_ATTEMPTS", 1)
        self.on_commit = options.get("ON_COMMIT")

    # -- the framework's interface ----------------------------------------
    def validate_task(self, task: Task) -> None:
        """The framework's rules, plus our queue-name rule."""
        super().validate_task(task)
        try:
            validate_queue(task.queue_name)
        except ValueError as err:
            raise InvalidTask(str(err)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Add ``task(*args, **kwargs)`` as a job; returns its READY
        ``TaskResult``. ``enqueued_at`` is None while the job waits for a
        commit (``ON_COMMIT``), else the time it landed. Raises
        ``InvalidTask``, ``PayloadError`` (arguments not JSON), ``RedisUnavailable``."""
        self.validate_task(task)
        payload: dict[str, Any] = {"task": task.module_path, "args": list(args), "kwargs": kwargs}
        if task.priority:
            payload["priority"] = task.priority
        if task.run_after is not None:
            payload["run_after"] = task.run_after.isoformat()
        if self.alias != "default":
            payload["backend"] = self.alias
        options: dict[str, Any] = {"job_id": new_id(), "max_attempts": self.max_attempts}
        if task.priority and self.supports_priority:
            options["priority"] = task.priority
        mq = get_mq()
        now = mq.clock()
        if task.run_after is not None:
            options["delay_ms"] = max(0, _ms(task.run_after) - now)
        deferred = api._defer(self.on_commit, None)
        if deferred:
            api.enqueue(task.queue_name, TASK_JOB_NAME, payload, on_commit=True, **options)
        else:
            # The row's created_at is this `now`, so get_result() equals this result.
            # The clock lives on the wire the parts share: pin a copy of it, not
            # the process's own (which would stop every later reading of its time).
            pinned = copy.copy(mq)
            pinned.wire = copy.copy(mq.wire)
            pinned.clock = lambda: now
            pinned.enqueue(task.queue_name, TASK_JOB_NAME, payload, **options)
        result = TaskResult(
            task=task,
            id=options["job_id"],
            status=TaskResultStatus.READY,
            enqueued_at=None if deferred else _when(now),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if deferred:
            from django.db import transaction

            transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result))
        else:
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The ``TaskResult`` of job ``result_id``, looked up in this
        backend's queues, then in the commit outbox (READY, ``enqueued_at``
        None: committed but not in Redis yet). Raises ``TaskResultDoesNotExist`` when no queue has
        it (or the job there is not a task), ``RedisUnavailable``."""
        try:
            validate_id(result_id)
        except (ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        mq = get_mq()
        for queue in sorted(self.queues):
            try:
                job = mq.get_job(queue, result_id)
            except JobNotFound:
                continue
            if job.name != TASK_JOB_NAME:
                raise TaskResultDoesNotExist(
                    f"job {result_id!r} in queue {queue!r} is not a task (its name is {job.name!r})"
                )
            errors = mq.attempt_errors(queue, result_id) if job.error else []
            return task_result(job, self.alias, errors)
        waiting = outbox.waiting_job(result_id, self.queues)
        if waiting is not None:  # committed, not in Redis yet: the commit outbox
            return task_result(waiting, self.alias)
        raise TaskResultDoesNotExist(result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``echomq_django.E030``-``E032``: QUEUES and OPTIONS of this backend."""
        return backend_problems(self.alias, self.queues, self.options)


def backend_problems(alias: str, queues, options) -> list[checks.CheckMessage]:
    """The system-check errors of one ``TASKS`` entry using this backend."""
    where = f"TASKS[{alias!r}]"
    out = []
    if not queues:
        out.append(
            checks.Error(
                f"{where} lists no QUEUES",
                hint="EchoMQBackend looks results up in its queues: list them, "
                "e.g. 'QUEUES': ['default'].",
                id="echomq_django.E030",
            )
        )
    for name in sorted(queues, key=str):
        try:
            validate_queue(name)
        except (ValueError, TypeError) as err:
            out.append(
                checks.Error(
                    f"{where} QUEUES: {err}",
                    hint="Rename the queue (and the tasks' queue_name).",
                    id="echomq_django.E031",
                )
            )
    if not isinstance(options, dict):
        options = {"(not a dict)": options}
    bad = sorted(set(options) - OPTION_KEYS, key=str)
    attempts = options.get("MAX_ATTEMPTS", 1)
    if bad:
        out.append(
            checks.Error(
                f"{where} OPTIONS has unknown keys: {', '.join(map(str, bad))}",
                hint=f"Allowed: {', '.join(sorted(OPTION_KEYS))}.",
                id="echomq_django.E032",
            )
        )
    if attempts is not None and (
        not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1
    ):
        out.append(
            checks.Error(
                f"{where} OPTIONS MAX_ATTEMPTS must be an integer >= 1 or None, got {attempts!r}",
                hint="None follows the queue's MAX_ATTEMPTS.",
                id="echomq_django.E032",
            )
        )
    if options.get("ON_COMMIT") not in (None, True, False):
        out.append(
            checks.Error(
                f"{where} OPTIONS ON_COMMIT must be None, True or False, "
                f"got {options['ON_COMMIT']!r}",
                hint="None waits for the commit inside an atomic block only.",
                id="echomq_django.E032",
            )
        )
    return out


# -- reading a job back as a TaskResult --------------------------------------

_BUILTIN_ERRORS = {"PayloadError": "echomq_django.core.exceptions.PayloadError"}


def task_error(error: str) -> TaskError:
    """A ``TaskError`` from a job's error text (worker.error_text: ``"Type:
    message"``, then the traceback's last lines, which end with the
    exception's qualified name)."""
    name = error.split("\n", 1)[0].split(":", 1)[0].strip()
    start = error.find("\nTraceback (most recent call last):")
    if start < 0:
        start = error.find("\n... (")
    body = error[start + 1 :] if start >= 0 else error
    path = None
    if name.isidentifier():
        pattern = re.compile(rf"^((?:[\w.]+\.)?{re.escape(name)})(?::|$)")
        for line in reversed(body.splitlines()):
            found = pattern.match(line)
            if found:
                path = found.group(1)
                break
    if path is None:
        path = _BUILTIN_ERRORS.get(name, name if "." in name else None)
    if path is None or "." not in path:
        import builtins

        is_builtin = isinstance(getattr(builtins, path or "", None), type)
        path = f"builtins.{path}" if is_builtin else "builtins.Exception"
    return TaskError(exception_class_path=path, traceback=body.rstrip("\n") + "\n")


def _task_of(job: Job, alias: str) -> Task:
    payload = job.payload or {}
    found = import_string(payload["task"])
    if not isinstance(found, Task):
        raise TypeError(f"{payload['task']!r} is not a task (decorate it with @task)")
    run_after = payload.get("run_after")
    changes = {"queue_name": job.queue, "backend": alias}
    if payload.get("priority"):
        changes["priority"] = payload["priority"]
    if run_after:
        changes["run_after"] = datetime.fromisoformat(run_after)
    try:
        return replace(found, **changes)
    except Exception:  # e.g. the queue left QUEUES since: the task as declared
        return found


def result_done(job: Job) -> bool:
    """True when the job will not run again (completed or dead)."""
    return job.state in (JobState.COMPLETED, JobState.DEAD)


def task_result(job: Job, alias: str, errors: list[str] | None = None) -> TaskResult:
    """The ``TaskResult`` of a task job read from Redis (the module docstring
    gives the mapping); ``errors``: its failed attempts' errors, oldest first
    (``EchoMQ.attempt_errors``; None: the row's last error alone). Raises
    ``TaskResultDoesNotExist`` when its task no longer resolves."""
    if errors is None:
        errors = [job.error] if job.error else []
    payload = job.payload or {}
    try:
        task = _task_of(job, alias)
    except (ImportError, AttributeError, KeyError, TypeError) as err:
        raise TaskResultDoesNotExist(f"job {job.id!r}: {err}") from None
    result = TaskResult(
        task=task,
        id=job.id,
        status=STATUS[job.state],
        enqueued_at=_when(job.created_at),
        started_at=_when(job.first_started_at),
        finished_at=_when(job.finished_at) if result_done(job) else None,
        last_attempted_at=_when(job.started_at),
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=alias,
        errors=[task_error(e) for e in errors],
        worker_ids=[WORKER_ID] * job.attempts,
    )
    if job.state is JobState.COMPLETED:
        object.__setattr__(result, "_return_value", job.result)
    return result


# -- running a task on a worker ------------------------------------------------


@handler(TASK_JOB_NAME)
def run_task(job: Job) -> Any:
    """The handler of every task job: resolves the task by its module path,
    sends the framework's ``task_started`` / ``task_finished`` signals and
    returns the task's JSON-serialisable return value. A failure that will
    be retried sends no ``task_finished``. While the task runs,
    ``current_job()`` is ``job`` (docs/howto/progress-and-logs.md#from-a-django-task).
    Raises what the task raises, ``PayloadError`` for a return value that is
    not JSON."""
    payload = job.payload or {}
    alias = payload.get("backend", "default")
    try:
        task = _task_of(job, alias)
    except (ImportError, AttributeError, KeyError, TypeError) as err:
        raise LookupError(f"task {payload.get('task')!r} does not resolve: {err}") from err
    mq = job._mq or get_mq()
    now, first, errors = mq.clock(), None, []
    if job.attempts > 1:  # a retry: the first start and the earlier errors are in Redis
        try:
            first = mq.get_job(job.queue, job.id).first_started_at
            errors = mq.attempt_errors(job.queue, job.id)
        except JobNotFound:
            pass
    result = TaskResult(
        task=task,
        id=job.id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=_when(job.created_at),
        started_at=_when(first or now),
        finished_at=None,
        last_attempted_at=_when(now),
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=alias,
        errors=[task_error(e) for e in errors],
        worker_ids=[WORKER_ID] * job.attempts,
    )
    task_started.send(EchoMQBackend, task_result=result)
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    token = running(job)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        mq.encode(value, "result")
    except BaseException as exc:
        if isinstance(exc, Unrecoverable) or job.attempts >= job.max_attempts:
            kind = type(exc)
            text = "".join(traceback.format_exception(exc))
            result.errors.append(
                TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}", traceback=text
                )
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
            task_finished.send(EchoMQBackend, task_result=result)
        raise
    finally:
        stop_running(token)
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(EchoMQBackend, task_result=result)
    return value
