"""Connections (docs/explanation/house.md, "protocol/"): a redis-py client from a URL,
the keyword arguments a client takes, and what a server says about itself.
No Django here: ``conf/`` reads the settings and calls these. This module
runs no script.
"""

from __future__ import annotations

import inspect
from urllib.parse import urlsplit

import redis
from redis.cluster import REDIS_ALLOWED_KEYS, RedisCluster

from ..core.exceptions import RedisUnavailable
from .errors import TRANSIENT

PROBE_TIMEOUT_S = 1.0  # how long a server probe may wait for Redis (s): checks stay quick


def client_options(cluster: bool) -> set[str]:
    """The keyword arguments ``redis.Redis.from_url`` (or, with ``cluster``,
    ``RedisCluster.from_url``) takes, as ``OPTIONS`` keys."""
    names = set(inspect.signature(redis.Redis.__init__).parameters)
    if cluster:
        names = set(inspect.signature(RedisCluster.__init__).parameters) | set(REDIS_ALLOWED_KEYS)
    return names - {"self", "kwargs", "args"}


def connect(url: str, cluster: bool, options: dict):
    """A redis-py client for ``url``: ``RedisCluster`` when ``cluster``, else
    ``redis.Redis`` (with a 30 s health check unless ``options`` set one).
    Raises ``RedisUnavailable`` when ``cluster`` and no startup node answers
    (``RedisCluster`` reads the slot map as it is built; a plain client
    connects on its first command instead)."""
    options = dict(options)
    if cluster:
        try:
            return RedisCluster.from_url(url, **options)
        except (redis.exceptions.RedisClusterException, *TRANSIENT) as err:
            where = urlsplit(url)
            raise RedisUnavailable(
                f"Redis Cluster is unreachable at {where.hostname}:{where.port}: {err}"
            ) from err
    options.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(url, **options)


def server_facts(
    url: str, timeout_s: float = PROBE_TIMEOUT_S
) -> tuple[bool, int | None, int] | None:
    """What the server at ``url`` says of itself, asked with a ``timeout_s``
    (s) timeout: ``(cluster enabled, databases it has (None on a Cluster
    node), the db index the URL selects)``. None when the URL does not
    parse, the server cannot be reached, or it refuses CONFIG (a managed
    server): then nothing can be said."""
    try:
        options = redis.connection.parse_url(url)
        db = int(options.pop("db", 0) or 0)
        kind = options.pop("connection_class", None)
        if "path" in options:
            options["unix_socket_path"] = options.pop("path")
        if kind is redis.connection.SSLConnection:
            options["ssl"] = True
        # db 0: a db the server lacks would fail the connection itself
        options |= {
            "db": 0,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry_on_error": [],
        }
        probe = redis.Redis(**options)
    except (ValueError, TypeError):
        return None
    try:
        enabled = probe.info("cluster").get("cluster_enabled") == 1
        databases = None if enabled else int(probe.config_get("databases").get("databases", 0))
    except redis.exceptions.RedisError:  # unreachable, or CONFIG refused
        return None
    finally:
        probe.close()
    return enabled, databases, db
