"""Redis errors become echomq_django errors here, at the protocol's edge.

``translate`` turns a script's ``EMQ...`` reply into its named exception
(``core.exceptions.ERRORS``); ``TRANSIENT`` lists redis-py's "not now" errors,
which ``reports_redis_down`` and ``connection_error`` turn into
``RedisUnavailable`` naming the address the client tried.
"""

from __future__ import annotations

import functools

import redis

from ..core.exceptions import ERRORS, MESSAGES, EchoMQError, RedisCommandError, RedisUnavailable


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
    template = MESSAGES.get(code)
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
# results and retries, exactly as for a dropped connection (docs/explanation/reliability.md).
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


def unblocked(err: BaseException) -> bool:
    """Whether ``err`` is Redis's ``-UNBLOCKED`` for a blocked command: the
    block was ended under it (a master demoted to a replica by a failover or
    ``REPLICAOF``; ``CLIENT UNBLOCK ... ERROR``), nothing was refused. "Not
    now", as ``TRANSIENT``: the call blocks again on the new master. (A
    Sentinel failover kills the old master's clients instead: a lost
    connection.)"""
    return isinstance(err, redis.ResponseError) and str(err).startswith("UNBLOCKED")


# A part's public call while Redis is away: TRANSIENT, or a Cluster that no
# node answers (RedisClusterException), or one whose map is failing (ClusterError).
AWAY = (*TRANSIENT, redis.exceptions.ClusterError, redis.exceptions.RedisClusterException)


def translating(method):
    """Decorate a public method of a part of ``EchoMQ`` (``wire.Part`` does
    it for each one): an error of ours passes, Redis away (``AWAY``, and a
    block a failover ended: ``unblocked``) becomes ``RedisUnavailable``
    naming the address, any other redis-py error
    ``RedisCommandError`` with the driver's words; each chains the
    original. So nothing above ``protocol/`` catches a redis-py error."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except EchoMQError:
            raise
        except AWAY as err:
            raise connection_error(getattr(self, "client", None), err) from err
        except redis.RedisError as err:
            if unblocked(err):  # a failover ended a block: not now, as AWAY
                raise connection_error(getattr(self, "client", None), err) from err
            raise RedisCommandError(
                f"Redis refused a command: {type(err).__name__}: {err}"
            ) from err

    wrapper.translating = True
    return wrapper


def reports_redis_down(method):
    """Decorate a method of an object with a ``client``: redis-py's transient
    errors (``TRANSIENT``, and ``-UNBLOCKED``: ``unblocked``) become
    ``RedisUnavailable`` naming the address the client tried."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except TRANSIENT as err:
            raise connection_error(self.client, err) from err
        except redis.ResponseError as err:
            if unblocked(err):  # a failover ended a block: not now
                raise connection_error(self.client, err) from err
            raise

    return wrapper


def connection_error(client: object, err: Exception) -> RedisUnavailable:
    """A ``RedisUnavailable`` that says where the client tried to connect,
    and, for an error other than a dropped connection, which one it was. A
    client whose connection pool is spent (every connection held, e.g. by
    blocking waits) is not an unreachable Redis: its message says so and
    names the setting that raises the bound (docs/howto/wait.md#many-waiters-in-one-process)."""
    if isinstance(err, redis.exceptions.MaxConnectionsError):
        return RedisUnavailable(
            f"the Redis client for {describe(client)} has no free connection: all "
            f"{pool_size(client)} of its pool are in use (each blocking wait or follow "
            "holds one); raise ECHOMQ OPTIONS max_connections or wait in fewer threads"
        )
    if isinstance(err, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return RedisUnavailable(f"Redis is unreachable at {describe(client)}: {err}")
    return RedisUnavailable(
        f"Redis is unavailable at {describe(client)}: {type(err).__name__}: {err}"
    )


def pool_size(client: object) -> int | str:
    """The connection bound of a redis-py client's pool, or ``"?"``."""
    pool = getattr(client, "connection_pool", None)
    return getattr(pool, "max_connections", None) or "?"


def describe(client: object) -> str:
    """``host:port/db`` (or the cluster's startup nodes, or the master a
    Sentinel pool follows) of a redis-py client."""
    try:
        pool = client.connection_pool  # type: ignore[attr-defined]
        if hasattr(pool, "service_name"):  # redis.sentinel.SentinelConnectionPool
            return f"Sentinel master {pool.service_name!r}"
        kw = pool.connection_kwargs
        if "path" in kw:
            return f"unix:{kw['path']}"
        scheme = "rediss" if "SSL" in getattr(pool, "connection_class", type).__name__ else "redis"
        return f"{scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
    except AttributeError:
        pass
    try:
        nodes = client.nodes_manager.startup_nodes  # type: ignore[attr-defined]
        return "cluster " + ",".join(sorted(nodes))
    except AttributeError:
        return repr(client)
