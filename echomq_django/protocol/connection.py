"""Connections (docs/explanation/house.md, "protocol/"): a redis-py client from a URL
or from Redis Sentinel, the keyword arguments a client takes, and what a
server says about itself.
No Django here: ``conf/`` reads the settings and calls these. This module
runs no script.
"""

from __future__ import annotations

import inspect
import re
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import REDIS_ALLOWED_KEYS, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

from ..core.exceptions import RedisUnavailable
from .errors import TRANSIENT

PROBE_TIMEOUT_S = 1.0  # how long a server probe may wait for Redis (s): checks stay quick
SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_PORT = 26379  # a sentinel's port when a URL names none
# Replies by which a master says it may no longer take writes: it lost its
# replicas to a failover (min-replicas-to-write), or it became a replica
# while a command was blocked on it.
MASTER_GONE = ("NOREPLICAS", "UNBLOCKED")
SENTINEL_URL_RULE = (
    "redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]"
)


URL_HINT = (
    "redis://[[user]:password@]host[:port][/db], db a whole number (0 when left out), "
    "port 1-65535; rediss:// alike with TLS; unix:///path/to/socket[?db=n]."
)


class CredentialsRefused(Exception):
    """The server refused the URL's user or password (``NOAUTH``, ``WRONGPASS``)."""


def url_flaw(url: str) -> str | None:
    """What makes ``url`` (a ``redis://`` or ``rediss://`` URL) one redis-py
    would misread, or None: a port that is not a number from 1 to 65535, or
    a path that is not one whole db index (redis-py reads ``/abc`` as db 0
    and ``/1/2`` as db 12; a trailing ``/`` is fine, and a ``?db=`` query
    wins over the path). Other schemes: None (their own checks apply)."""
    if not url.startswith(("redis://", "rediss://")):
        return None
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError:
        return f"its port is not a number from 1 to 65535 ({parts.netloc.rpartition(':')[2]!r})"
    db = parts.path.strip("/")  # redis-py drops every "/": "/1/2" is db 12
    if db and "db=" not in parts.query and not (db.isascii() and db.isdigit()):
        return f"its path {parts.path!r} is not a db index (a whole number, as in /0)"
    return None


QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")  # a password passed as a query parameter


def redacted(url):
    """``url`` (a Redis URL) with its password written ``***``, as logs and
    error messages show it: the user info's (up to the last ``@`` of the
    host part, as the URL parser reads it) and a ``password=`` query
    parameter's; anything else as it is."""
    if not isinstance(url, str) or "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    cut = min([i for i in map(rest.find, "/?#") if i >= 0], default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    tail = QUERY_PASSWORD.sub(r"\1***", tail)
    return f"{scheme}://{netloc}{tail}"


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
    url: str, timeout_s: float = PROBE_TIMEOUT_S, client: dict | None = None
) -> tuple[bool, int | None, int, str | None] | None:
    """What the server at ``url`` says of itself, asked once with a ``timeout_s``
    (s) timeout: ``(cluster enabled, databases it has (None on a Cluster
    node), the db index the URL selects, its maxmemory-policy (None when
    INFO does not say))``. ``client``: the settings'
    ``OPTIONS``, whose credentials and TLS options the probe uses as the
    client does (the URL's win, as in ``from_url``). None when the URL does
    not parse, the server cannot be reached, or it refuses CONFIG (a managed
    server): then nothing can be said. Raises ``CredentialsRefused`` when
    the server refuses the user or password the client would send."""
    try:
        options = {
            k: v
            for k, v in (client or {}).items()
            if k in ("username", "password", "credential_provider") or k.startswith("ssl")
        }
        options |= redis.connection.parse_url(url)
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
            "retry": Retry(NoBackoff(), 0),  # one try: redis-py 8's default tried 11 times (4.6 s)
        }
        probe = redis.Redis(**options)
    except (ValueError, TypeError):
        return None
    try:
        enabled = probe.info("cluster").get("cluster_enabled") == 1
        policy = probe.info("memory").get("maxmemory_policy")
        databases = None if enabled else int(probe.config_get("databases").get("databases", 0))
    except redis.exceptions.AuthenticationError as err:  # a config error, not an outage
        raise CredentialsRefused(str(err)) from None
    except redis.exceptions.RedisError:  # unreachable, or CONFIG refused
        return None
    finally:
        probe.close()
    return enabled, databases, db, policy if isinstance(policy, str) else None


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict]:
    """A ``redis+sentinel://`` URL (``SENTINEL_URL_RULE``) as ``(sentinels,
    master name, options)``: ``[(host, port), ...]`` (port 26379 when left
    out), the name the sentinels monitor, and the master's ``db``,
    ``username`` and ``password`` when given
    (docs/howto/sentinel.md#a-url-instead). Raises ``ValueError`` naming the
    rule when the URL does not follow it."""
    bad = ValueError(f"{redacted(url)!r} is not a Sentinel URL: {SENTINEL_URL_RULE}")
    if not isinstance(url, str) or not url.startswith(SENTINEL_SCHEME):
        raise bad
    parts = urlsplit(url)
    creds, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.partition(":")
        if not host or (colon and not port.isdigit()):
            raise bad
        sentinels.append((host, int(port) if colon else SENTINEL_PORT))
    path = [p for p in parts.path.split("/") if p]
    if not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()) or parts.query:
        raise bad
    options: dict = {"db": int(path[1])} if len(path) == 2 else {}
    if creds:
        user, _, password = creds.partition(":")
        options |= {"username": unquote(user)} if user else {}
        options |= {"password": unquote(password)} if password else {}
    return sentinels, unquote(path[0]), options


class _FollowMaster:
    """A Sentinel-managed connection that also treats ``MASTER_GONE`` replies
    as a master gone: it drops the connection, so the next one asks the
    sentinels again, and raises ``ConnectionError`` (redis-py does the same
    for ``READONLY`` only). With ``min-replicas-to-write`` set on the
    servers, an old master refuses writes as soon as its replica is
    promoted: the client moves then, not when the old master is demoted
    (docs/howto/sentinel.md#what-a-failover-does)."""

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except redis.exceptions.ResponseError as err:
            if self.connection_pool.is_master and str(err).startswith(MASTER_GONE):
                self.disconnect()
                raise redis.exceptions.ConnectionError(
                    f"the master refused a write ({str(err).split(' ', 1)[0]}): "
                    "asking the sentinels again"
                ) from err
            raise


class FollowMaster(_FollowMaster, SentinelManagedConnection):
    """``_FollowMaster`` over a plain connection."""


class FollowMasterSSL(_FollowMaster, SentinelManagedSSLConnection):
    """``_FollowMaster`` over TLS."""


def connect_sentinel(
    sentinels: list, master_name: str, options: dict, sentinel_kwargs: dict | None = None
) -> redis.Redis:
    """A ``redis.Redis`` on the master the sentinels name ``master_name``,
    through redis-py's ``Sentinel.master_for``: each new connection asks the
    sentinels where the master is, and one to a master that became a
    replica, or lost its replicas, is dropped at its first refused write
    (``READONLY``, ``NOREPLICAS``, ``UNBLOCKED``), so a client follows a
    failover without a restart
    (docs/howto/sentinel.md). ``sentinels``: ``[(host, port), ...]``;
    ``options``: the master's client arguments (``OPTIONS``: ``db``,
    ``password``, ``socket_timeout``..., with a 30 s health check unless
    set); ``sentinel_kwargs``: the sentinels' own (``password``...).
    Connects to nothing until the first command."""
    options = dict(options)
    options.setdefault("health_check_interval", 30)
    options["connection_class"] = FollowMasterSSL if options.pop("ssl", False) else FollowMaster
    pairs = [(str(host), int(port)) for host, port in sentinels]
    return Sentinel(pairs, sentinel_kwargs=sentinel_kwargs or None, **options).master_for(
        master_name
    )
