"""How a canvas's handler reads its inputs
(docs/howto/canvas.md#how-a-handler-reads-its-inputs): the results of the
jobs it waited for, which a flow hands a parent as its children's results.

``previous_result(job)`` is a chain link's input (its one child's result);
``group_results(job)`` a chord callback's (its children's results in the
order the group gave them, one read of the ordered ``:children`` list and
the ``:processed`` hash, ``PAGE_MAX`` children a round trip). This module
also registers the handler of a group's own node.
"""

from __future__ import annotations

from typing import Any

from ..core.jobs import Job
from ..handlers import handler
from .signatures import GROUP_JOB


def group_results(job: Job) -> list:
    """The results of the jobs ``job`` waited for, in the order its canvas
    gave them (a chord's group order), ``None`` in the place of a member
    that died under ``allow_failure`` (its error: ``job.ignored_failures()``).
    ``[]`` for a job that waited for nothing. Read once per ``Job`` object,
    then cached. Raises ``RuntimeError`` for a ``Job`` not read through an
    ``EchoMQ``, ``JobNotFound`` once the job is gone, ``RedisUnavailable``.
    docs/howto/canvas.md#how-a-handler-reads-its-inputs"""
    if "child_results" not in job._cache:
        job._cache["child_results"] = job._require_mq().child_results(job.queue, job.id)
    return job._cache["child_results"]


def previous_result(job: Job) -> Any:
    """A chain link's input: the result of the link before it (``job``'s
    only child); ``None`` for the first link, and for a link before it that
    died under ``allow_failure``. Raises ``ValueError`` for a job that
    waited for several (a chord's callback: read ``group_results``), and
    ``group_results``' errors. docs/howto/canvas.md#how-a-handler-reads-its-inputs"""
    values = group_results(job)
    if len(values) > 1:
        raise ValueError(
            f"job {job.queue}/{job.id} waited for {len(values)} jobs, not one: "
            "a chord's callback reads group_results(job)"
        )
    return values[0] if values else None


@handler(GROUP_JOB)
def collect(job: Job) -> list:
    """A group's own node: its members' results, in order."""
    return group_results(job)
