"""Named exceptions, and the one table that maps script error strings to them.

Lua scripts answer ``EMQ<CODE> ...`` error strings (DESIGN §5 rule 2); callers
catch ``JobNotActive``, never a string (STYLE rule 3).
"""

from __future__ import annotations

import functools

import redis


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
    """The job was cancelled while it ran (``EMQCANCELLED``, DESIGN §10.2): its
    heartbeat is refused and its result dropped; it dies with 'cancelled'."""


class JobNotRemovable(EchoMQError):
    """``remove`` of an active job (DESIGN §10.2); the message names the state."""


class JobNotCancellable(EchoMQError):
    """``cancel`` of a completed or dead job (DESIGN §10.2); the message names
    the state."""


class Unrecoverable(EchoMQError):
    """Raise it in a handler to fail the job for good: it goes dead at once,
    without spending its remaining attempts (BullMQ's UnrecoverableError), and
    its parent's policy applies (DESIGN §4)."""


class SweepLockLost(EchoMQError):
    """A pump lost its sweep lock before trimming the outbox (``EMQLOCK``)."""


class RedisUnavailable(EchoMQError, ConnectionError):
    """Redis could not be reached; the message says where we tried."""


class DependencyError(EchoMQError, ValueError):
    """remove_child_dependency on a ref that is not an unresolved child of
    the parent (``EMQDEP``; DESIGN §10.3)."""


class RateLimited(EchoMQError):
    """Raise it in a handler to put the job back without spending an attempt:
    it runs again after ``retry_after_ms`` (ms, int >= 0), DESIGN §10.3."""

    def __init__(self, retry_after_ms: int = 1000, message: str = "") -> None:
        if not isinstance(retry_after_ms, int) or isinstance(retry_after_ms, bool):
            raise TypeError(f"retry_after_ms must be an int (ms), got {retry_after_ms!r}")
        if retry_after_ms < 0:
            raise ValueError(f"retry_after_ms must be >= 0 ms, got {retry_after_ms}")
        super().__init__(message or f"rate limited: retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


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

_MESSAGES = {
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


def translate(err: redis.exceptions.ResponseError | str) -> Exception:
    """Turn a script's ``EMQ...`` error reply (a ``ResponseError``, or its
    text as a batched script returns it per job) into its named exception.

    Returns ``err`` unchanged (text: as a ``ResponseError``) when it is not
    one of ours.
    """
    text = str(err)
    code, _, rest = text.partition(" ")
    cls = ERRORS.get(code)
    if cls is None:
        return redis.exceptions.ResponseError(err) if isinstance(err, str) else err
    template = _MESSAGES.get(code)
    # the last placeholder takes the rest (a state, a reason with spaces)
    parts = rest.split(" ", max(template.count("{") - 1, 2) if template else 2)
    if template and len(parts) >= template.count("{"):
        message = template.format(*parts, "", "")
    else:
        message = rest
    exc = cls(message)
    exc.code = code
    exc.parts = parts
    return exc


# Errors that say "not now", not "no": the connection dropped, a Cluster is
# failing over (CLUSTERDOWN, TRYAGAIN, MOVED/ASK while its map heals, a
# replica that is not promoted yet answering READONLY), a restarted server
# still LOADING its data, a full one (OOM). The call may be repeated (every script recognises
# its own replay), so these become ``RedisUnavailable``: a worker keeps its
# results and retries, exactly as for a dropped connection (issue 17, item 3).
# Only a script's own refusals (EMQSTATE, EMQLEASE, EMQNOJOB...) drop work.
TRANSIENT = (
    redis.exceptions.ConnectionError,  # BusyLoadingError (LOADING) included
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.AskError,  # MovedError included
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.OutOfMemoryError,  # OOM: a full server, until memory is freed
)


def reports_redis_down(method):
    """Decorate a method of an object with a ``client``: redis-py's transient
    errors (``TRANSIENT``) become ``RedisUnavailable`` naming the address
    the client tried."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except TRANSIENT as err:
            raise connection_error(self.client, err) from err

    return wrapper


def connection_error(client: object, err: Exception) -> RedisUnavailable:
    """A ``RedisUnavailable`` that says where the client tried to connect,
    and, for an error other than a dropped connection, which one it was."""
    if isinstance(err, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return RedisUnavailable(f"Redis is unreachable at {describe(client)}: {err}")
    return RedisUnavailable(
        f"Redis is unavailable at {describe(client)}: {type(err).__name__}: {err}"
    )


def describe(client: object) -> str:
    """``host:port/db`` (or the cluster's startup nodes) of a redis-py client."""
    try:
        kw = client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
        if "path" in kw:
            return f"unix:{kw['path']}"
        return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
    except AttributeError:
        pass
    try:
        nodes = client.nodes_manager.startup_nodes  # type: ignore[attr-defined]
        return "cluster " + ",".join(sorted(nodes))
    except AttributeError:
        return repr(client)
