"""Every other call of the module API over the ``EchoMQ`` built from settings
(docs/explanation/house.md, "api/"): reads, acts on jobs and queues, waiting
for a result, a job's log lines and following events. Each is the
``EchoMQ`` method of the same name on ``conf.get_mq()``.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from ..conf import get_mq
from ..core.exceptions import JobNotFound
from ..core.jobs import Dependencies, Job, Outcome
from ..core.refs import JobRef, Page, RefDict, as_ref
from ..protocol.live.blocking import Cancel, off_loop


@contextmanager
def _landing_hint():
    """Re-raise a ``JobNotFound`` met inside ``transaction.atomic()`` (the
    default database's) with why it may be so: a job enqueued in that
    transaction lands in Redis at its commit (docs/howto/durable-enqueue.md)."""
    try:
        yield
    except JobNotFound as err:
        if not transaction.get_connection().in_atomic_block:
            raise
        raise JobNotFound(
            f"{err}; this runs inside transaction.atomic(): if it was enqueued in that "
            "transaction, it lands in Redis when it commits: read or wait for it after "
            "the block"
        ) from err


def wait(
    job: Any, job_id: str | None = None, timeout_s: float | None = None, *, cancel=None
) -> Job:
    """Block until a job finishes, ``timeout_s`` s at most (a number from 0
    to a year; None: until it finishes), and return the completed ``Job``
    (``.result``): ``EchoMQ.wait`` on the settings' connection. The job is
    ``(job, job_id)`` = (queue, id), or a ``JobRef`` / ``"queue/id"`` as
    ``job`` (a flow's root: ``flow_ref.ref``). Raises ``ValueError`` for a
    bad timeout or id (before any Redis I/O), ``JobNotFound`` at once for an
    unknown id (or when it was removed, or finished and was removed before
    the wait read it), ``JobDead`` when it ended dead (cancelled included),
    builtin ``TimeoutError`` after ``timeout_s`` or once ``cancel`` (a
    ``threading.Event``, set from another thread) is set, at its next block,
    ``RedisUnavailable``. It holds one Redis connection while it blocks.
    Inside ``transaction.atomic()`` a ``JobNotFound`` says that a job
    enqueued in that transaction lands at its commit. docs/howto/wait.md"""
    with _landing_hint():
        return get_mq().wait(job, job_id, timeout_s, cancel=cancel)


async def await_result(job: Any, job_id: str | None = None, timeout_s: float | None = None) -> Job:
    """``wait`` for async code: the blocking wait runs on a thread of its
    own (``protocol/live/blocking.py``), so the event loop, Django's ORM
    thread and the loop's shared executor stay free. Same arguments, result,
    errors. A cancelled await ends the wait at once: its block's socket is
    shut down (``blocking.Cancel``). docs/howto/wait.md#in-an-async-view"""
    cancel = Cancel()

    def run() -> Job:
        return get_mq().wait(job, job_id, timeout_s, cancel=cancel)

    try:
        return await off_loop(run, name="echomq-wait")
    except asyncio.CancelledError:
        cancel.set()
        raise


def events(queues, since=None, kinds=None, block_s: float | None = None):
    """``EchoMQ.events`` on the settings' connection (docs/howto/events.md)."""
    return get_mq().events(queues, since, kinds, block_s)


def get_job(queue: Any, job_id: str | None = None) -> Job:
    """``EchoMQ.get_job`` on the settings' connection; the job is (queue, ``job_id``) or a
    ``JobRef`` / ``"queue/id"`` as ``queue`` (``get_job(ref)``). Inside
    ``transaction.atomic()`` a ``JobNotFound`` says that a job enqueued in
    that transaction lands at its commit."""
    with _landing_hint():
        return get_mq().get_job(queue, job_id)


def job_logs(job: Any, job_id: str | None = None, start: int = 0, end: int = -1) -> list[str]:
    """``EchoMQ.job_logs`` on the settings' connection; the job is (queue, ``job_id``) or a
    ``JobRef`` / ``"queue/id"`` as ``job``. docs/howto/progress-and-logs.md#read-them-back"""
    return get_mq().job_logs(job, job_id, start, end)


def retry(queue: Any, job_id: str | None = None) -> Outcome:
    """``EchoMQ.retry`` (retry-by-id of a dead job) on the settings' connection; the job is
    (queue, ``job_id``) or a ``JobRef`` / ``"queue/id"`` as ``queue``."""
    return get_mq().retry(queue, job_id)


def children_values(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> RefDict | Page[RefDict]:
    """``EchoMQ.children_values`` on the settings' connection: ``{JobRef:
    result}``, or one ``Page`` with ``count`` (docs/howto/read-flows.md#paged-reads)."""
    return get_mq().children_values(queue, job_id, cursor, count)


def dependencies(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> Dependencies | Page[Dependencies]:
    """``EchoMQ.dependencies`` on the settings' connection, or one ``Page`` of it with
    ``count`` (docs/howto/read-flows.md#paged-reads)."""
    return get_mq().dependencies(queue, job_id, cursor, count)


def dependency_counts(queue: str, job_id: str) -> dict:
    """``EchoMQ.dependency_counts`` on the settings' connection."""
    return get_mq().dependency_counts(queue, job_id)


def ignored_failures(
    queue: str, job_id: str, cursor: int = 0, count: int | None = None
) -> RefDict | Page[RefDict]:
    """``EchoMQ.ignored_failures`` on the settings' connection: ``{JobRef:
    error}``, or one ``Page`` with ``count`` (docs/howto/read-flows.md#paged-reads)."""
    return get_mq().ignored_failures(queue, job_id, cursor, count)


def get_flow(queue: str, job_id: str, depth: int | None = None) -> dict:
    """``EchoMQ.get_flow`` on the settings' connection."""
    return get_mq().get_flow(queue, job_id, depth)


def pause(queue: str) -> bool:
    """``EchoMQ.pause`` on the settings' connection (docs/explanation/protocol.md#scheduling)."""
    return get_mq().pause(queue)


def resume(queue: str) -> bool:
    """``EchoMQ.resume`` on the settings' connection (docs/explanation/protocol.md#scheduling)."""
    return get_mq().resume(queue)


def is_paused(queue: str) -> bool:
    """``EchoMQ.is_paused`` on the settings' connection
    (docs/explanation/protocol.md#scheduling)."""
    return get_mq().is_paused(queue)


def remove_child_dependency(queue: str, parent_id: str, child: JobRef | tuple[str, str] | str):
    """``EchoMQ.remove_child_dependency`` on the settings' connection
    (docs/explanation/protocol.md#removing-a-dependency): ``child`` a ``JobRef`` or ``(queue,
    id)``; a raw key is deprecated (docs/howto/read-flows.md#deprecated-raw-keys)."""
    mq = get_mq()
    return mq.remove_child_dependency(queue, parent_id, as_ref(child, mq.keys, 3))


def remove_unprocessed_children(queue: str, parent_id: str):
    """``EchoMQ.remove_unprocessed_children`` on the settings' connection
    (docs/explanation/protocol.md#removing-a-dependency)."""
    return get_mq().remove_unprocessed_children(queue, parent_id)


def remove(queue: Any, job_id: str | None = None):
    """``EchoMQ.remove`` on the settings' connection (docs/explanation/lifecycle.md): remove
    a job that is not active, with its subtree; the job is (queue, ``job_id``) or a
    ``JobRef`` / ``"queue/id"`` as ``queue``. Raises ``JobNotFound``, ``JobNotRemovable``."""
    return get_mq().remove(queue, job_id)


def cancel(queue: Any, job_id: str | None = None):
    """``EchoMQ.cancel`` on the settings' connection (docs/explanation/lifecycle.md): cancel a
    job and its unfinished subtree (active: marked); the job is (queue, ``job_id``) or a
    ``JobRef`` / ``"queue/id"`` as ``queue``. ``JobNotFound``, ``JobNotCancellable``."""
    return get_mq().cancel(queue, job_id)
