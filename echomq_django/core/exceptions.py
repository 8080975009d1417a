"""Named exceptions, and the one table that maps script error strings to them.

Lua scripts answer ``EMQ<CODE> ...`` error strings
(docs/explanation/protocol.md#error-codes); callers
catch ``JobNotActive``, never a string.
"""

from __future__ import annotations

import re

# a job key P:{queue}:job:<id> in an error ("failed by child ...") reads as queue/id
_JOB_KEY = re.compile(r"[A-Za-z0-9_.-]{1,32}:\{([A-Za-z0-9_.-]{1,64})\}:job:([^\s{}:]{1,128})")


def error_unkeyed(error) -> str:
    """A job's error with the job keys in it shown as ``queue/id``; ``""`` for None."""
    return _JOB_KEY.sub(r"\1/\2", str(error or ""))


def error_headline(error) -> str:
    """A job's error's first line (the ``ExcType: message`` the worker writes
    before the traceback), job keys in it shown as ``queue/id``; ``""`` for None."""
    return error_unkeyed(str(error or "").split("\n", 1)[0])


class EchoMQError(Exception):
    """Base class of every echomq_django error."""


class JobNotFound(EchoMQError, KeyError):
    """No job with that id in that queue (``EMQNOJOB``)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class JobNotActive(EchoMQError):
    """complete / fail / extend_lease on a job that is not active (``EMQSTATE``)."""


class LeaseLost(EchoMQError):
    """The lease token is stale: the lease expired and the job moved on (``EMQLEASE``)."""


class DuplicateJob(EchoMQError, ValueError):
    """The job id is already taken in that queue (``EMQDUP``)."""


class FlowConflict(DuplicateJob):
    """A flow reuses an id held by another job or a different flow (``EMQCONFLICT``)."""


class FlowError(EchoMQError, ValueError):
    """A flow is malformed: duplicate ids, a cycle, a bad policy."""


class PayloadError(EchoMQError, ValueError):
    """A payload or result is not JSON-serialisable, or is over the size limit."""


class JobNotRetryable(EchoMQError):
    """retry-by-id on a job that is not dead (``EMQSTATE`` from ``retry``)."""


class JobCancelled(JobNotActive):
    """The job was cancelled while it ran (``EMQCANCELLED``, docs/explanation/lifecycle.md): its
    heartbeat is refused and its result dropped; it dies with 'cancelled'."""


class JobNotRemovable(EchoMQError):
    """``remove`` of an active job (docs/explanation/lifecycle.md); the message names the state."""


class JobNotCancellable(EchoMQError):
    """``cancel`` of a completed or dead job (docs/explanation/lifecycle.md); the message names
    the state."""


class Unrecoverable(EchoMQError):
    """Raise it in a handler to fail the job for good: it goes dead at once,
    without spending its remaining attempts (BullMQ's UnrecoverableError), and
    its parent's policy applies (docs/explanation/protocol.md#policies)."""


class JobDead(EchoMQError):
    """``wait`` / ``await_result`` on a job that ended dead (failed for good
    or cancelled): ``job`` is the dead ``Job``, ``error`` its last error
    (``"cancelled"`` for a cancelled one), ``headline`` that error's first line.
    docs/howto/wait.md#a-dead-job-raises-jobdead"""

    def __init__(self, job) -> None:
        self.job = job
        self.error = job.error
        super().__init__(f"job {job.id!r} in queue {job.queue!r} is dead: {job.error}")

    @property
    def headline(self) -> str:
        """``error``'s first line (``ExcType: message``), a job key in it shown as
        ``queue/id``: what a view may show a visitor, the traceback left out."""
        return error_headline(self.error)


class SweepLockLost(EchoMQError):
    """A pump lost its sweep lock before trimming the outbox (``EMQLOCK``)."""


class RedisCommandError(EchoMQError):
    """Redis answered a command with an error that is not one of ours
    (``WRONGTYPE``, ``NOPERM``, a script's runtime error...); the driver's
    error is chained as ``__cause__``."""


class RedisUnavailable(EchoMQError, ConnectionError):
    """Redis could not be reached; the message says where we tried."""


class DependencyError(EchoMQError, ValueError):
    """remove_child_dependency on a ref that is not an unresolved child of
    the parent (``EMQDEP``; docs/explanation/protocol.md#removing-a-dependency)."""


class RateLimited(EchoMQError):
    """Raise it in a handler to put the job back without spending an attempt:
    it runs again after ``retry_after_ms`` (ms, int >= 0),
    docs/explanation/protocol.md#scheduling."""

    def __init__(self, retry_after_ms: int = 1000, message: str = "") -> None:
        if not isinstance(retry_after_ms, int) or isinstance(retry_after_ms, bool):
            raise TypeError(f"retry_after_ms must be an int (ms), got {retry_after_ms!r}")
        if retry_after_ms < 0:
            raise ValueError(f"retry_after_ms must be >= 0 ms, got {retry_after_ms}")
        super().__init__(message or f"rate limited: retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class Retry(EchoMQError):
    """Raise it in a handler to retry the job after ``after_ms`` (ms, int
    from 0 to ten years) instead of its backoff: the attempt counts (the job
    dies when its attempts are spent), unlike ``RateLimited``; no jitter is
    added and ``retry_on`` / ``dont_retry_on`` do not apply.
    docs/howto/retries.md#asking-for-a-delay-retry"""

    def __init__(self, after_ms: int, message: str = "") -> None:
        if not isinstance(after_ms, int) or isinstance(after_ms, bool):
            raise TypeError(f"Retry(after_ms) must be an int (ms), got {after_ms!r}")
        if not 0 <= after_ms <= 315_360_000_000:
            raise ValueError(f"Retry(after_ms) must be from 0 to 315360000000 ms, got {after_ms}")
        super().__init__(message or f"retry asked in {after_ms} ms")
        self.after_ms = after_ms


class MoveToDelayed(EchoMQError):
    """A step job's handler ends its attempt and runs again after
    ``delay_ms`` (ms, int from 0 to ten years) with its payload as it left
    it (``job.update_payload``): not a failure, and the attempt is taken
    back, as for ``RateLimited``. ``job.move_to_delayed(ms)`` raises it;
    a handler may raise it itself. Let it propagate: a handler that catches
    it completes instead. docs/howto/step-jobs.md#move-to-delayed"""

    def __init__(self, delay_ms: int, message: str = "") -> None:
        if not isinstance(delay_ms, int) or isinstance(delay_ms, bool):
            raise TypeError(f"move_to_delayed(delay_ms) must be an int (ms), got {delay_ms!r}")
        if not 0 <= delay_ms <= 315_360_000_000:
            raise ValueError(
                f"move_to_delayed(delay_ms) must be from 0 to 315360000000 ms, got {delay_ms}"
            )
        super().__init__(message or f"moved to delayed for {delay_ms} ms")
        self.delay_ms = delay_ms


class WaitForChildren(EchoMQError):
    """Raise it in a handler after ``job.add_children(...)``: the attempt
    ends (not a failure; taken back) and the job is held
    (``awaiting_children``) until every child resolved, then runs again and
    reads their results with ``job.children_values()``. A job whose children
    all resolved already runs again at once; one an ``fp`` child failed
    dies. docs/howto/step-jobs.md#add-children-and-wait"""


# code -> exception class; JobNotActive for EMQSTATE is swapped for
# JobNotRetryable by the retry path, where "not in the expected state" means
# "not dead".
ERRORS: dict[str, type[EchoMQError]] = {
    "EMQNOJOB": JobNotFound,
    "EMQSTATE": JobNotActive,
    "EMQLEASE": LeaseLost,
    "EMQDUP": DuplicateJob,
    "EMQCONFLICT": FlowConflict,
    "EMQLOCK": SweepLockLost,
    "EMQDEP": DependencyError,
    "EMQPARENT": JobNotRetryable,
    "EMQCANCELLED": JobCancelled,
}

MESSAGES = {  # code -> message template; protocol.errors.translate fills it
    "EMQNOJOB": "job {1!r} not found in queue {0!r}",
    "EMQSTATE": "job {1!r} in queue {0!r} is {2}",
    "EMQLEASE": "job {1!r} in queue {0!r}: lease token is stale (the lease expired "
    "and the job was recovered or claimed again)",
    "EMQDUP": "job id {1!r} is already used in queue {0!r} (state {2}); ids are unique per queue",
    "EMQDEP": "parent {1!r} in queue {0!r}: child {2}",
    "EMQPARENT": "job {1!r} in queue {0!r} cannot be retried: its parent {2}/{3} ignored its "
    "death and is {4} now (it went on without it; a child its parent ignored re-attaches "
    "only while the parent waits)",
    "EMQCANCELLED": "job {1!r} in queue {0!r} was cancelled: its result is dropped",
}
