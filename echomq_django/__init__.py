"""echomq_django: a reliable Redis-backed job queue for Django with flows.

The public API (docs/explanation/house.md#the-root-djangos-conventional-files). Module-level
functions use the ``EchoMQ`` built
from the ``ECHOMQ`` setting (conf.get_mq); ``EchoMQ(client, prefix=...)``
offers the same methods over any redis-py client.
"""

from .api import (
    aadd_flow,
    add_flow,
    add_flows,
    aenqueue,
    await_result,
    cancel,
    children_values,
    dependencies,
    dependency_counts,
    enqueue,
    enqueue_many,
    events,
    get_flow,
    get_job,
    ignored_failures,
    is_paused,
    job_logs,
    pause,
    remove,
    remove_child_dependency,
    remove_unprocessed_children,
    resume,
    retry,
    wait,
)
from .api.controls import Schedules, get_concurrency, schedules, set_concurrency
from .canvas import Signature, chain, chord, group, group_results, previous_result, task
from .core.events import Event, Gap
from .core.exceptions import (
    DependencyError,
    DuplicateJob,
    EchoMQError,
    FlowConflict,
    FlowError,
    JobCancelled,
    JobDead,
    JobNotActive,
    JobNotCancellable,
    JobNotFound,
    JobNotRemovable,
    JobNotRetryable,
    LeaseLost,
    PayloadError,
    RateLimited,
    RedisCommandError,
    RedisUnavailable,
    Unrecoverable,
)
from .core.flows import Flow, FlowRef
from .core.jobs import Dependencies, Job, JobState, Outcome
from .core.live import current_job
from .core.refs import JobRef, Page
from .handlers import handler
from .protocol.client import EchoMQ
from .runners.dispatcher import Dispatcher
from .runners.pump import Pump
from .runners.worker import Worker

__all__ = [
    "Dependencies",
    "DependencyError",
    "Dispatcher",
    "DuplicateJob",
    "EchoMQ",
    "EchoMQError",
    "Event",
    "Flow",
    "FlowConflict",
    "FlowError",
    "FlowRef",
    "Gap",
    "Job",
    "JobCancelled",
    "JobDead",
    "JobNotActive",
    "JobNotCancellable",
    "JobNotFound",
    "JobNotRemovable",
    "JobNotRetryable",
    "JobRef",
    "JobState",
    "LeaseLost",
    "Outcome",
    "Page",
    "PayloadError",
    "Pump",
    "RateLimited",
    "RedisCommandError",
    "RedisUnavailable",
    "Schedules",
    "Signature",
    "Unrecoverable",
    "Worker",
    "aadd_flow",
    "add_flow",
    "add_flows",
    "aenqueue",
    "await_result",
    "cancel",
    "chain",
    "children_values",
    "chord",
    "current_job",
    "dependencies",
    "dependency_counts",
    "enqueue",
    "enqueue_many",
    "events",
    "get_concurrency",
    "get_flow",
    "get_job",
    "group",
    "group_results",
    "handler",
    "ignored_failures",
    "is_paused",
    "job_logs",
    "pause",
    "previous_result",
    "remove",
    "remove_child_dependency",
    "remove_unprocessed_children",
    "resume",
    "retry",
    "schedules",
    "set_concurrency",
    "task",
    "wait",
]
