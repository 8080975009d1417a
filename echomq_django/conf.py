"""Settings: the one ``ECHOMQ`` dict, read and validated here (DESIGN §8).

Shape::

    ECHOMQ = {
        "URL": "redis://127.0.0.1:6379/0",  # or "CACHE": "default" (a Redis cache alias)
        "CLUSTER": False,                   # True: redis.cluster.RedisCluster from URL
        "PREFIX": "emq",
        "QUEUES": {"orders": {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 1000, "LEASE_MS": 30000,
                              # retention (DESIGN §10.2): a count, or COUNT / AGE_S
                              "KEEP_COMPLETED": {"COUNT": 1000, "AGE_S": 86400},
                              "KEEP_DEAD": {"COUNT": 10000, "AGE_S": 1209600}}},
        "MAX_PAYLOAD_BYTES": 524288,        # bytes of JSON per payload / result
    }

The environment variable ``ECHOMQ_URL``, when set, overrides the connection
(it wins over both ``URL`` and ``CACHE``). Nothing here touches Redis until
``get_mq()`` is first called; the client is built then, once per process
(and again after ``reset()``).
"""

from __future__ import annotations

import os
import threading
from importlib.util import find_spec

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .client import EchoMQ
from .jobs import MAX_PAYLOAD_BYTES
from .keyspace import validate_prefix, validate_queue
from .retention import KEEP_HINT, KEEP_KEYS, keep_problems

TOP_KEYS = {"URL", "CACHE", "CLUSTER", "PREFIX", "QUEUES", "MAX_PAYLOAD_BYTES", "OPTIONS"}
TOP_KEYS |= {"METRICS"}  # metrics.settings_problems checks it (issue 15)
QUEUE_KEYS = {"MAX_ATTEMPTS", "BACKOFF_MS", "LEASE_MS", "KEEP_COMPLETED", "KEEP_DEAD"}
URL_SCHEMES = ("redis://", "rediss://", "unix://")
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"

_lock = threading.Lock()
_mq = None


def config() -> dict:
    """The ``ECHOMQ`` setting as a dict (empty when unset)."""
    value = getattr(settings, "ECHOMQ", {})
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"ECHOMQ must be a dict, got {type(value).__name__}")
    return value


def problems(cfg: dict | None = None) -> list[tuple[str, str, str]]:
    """Every problem with the settings as ``(check id, message, hint)``.

    Used by the system checks (checks.py) and by ``get_mq()``; reads
    settings only, never Redis.
    """
    from django.core.cache import caches  # noqa: F401  (settings only, no I/O)

    cfg = config() if cfg is None else cfg
    out = []
    unknown = sorted(set(cfg) - TOP_KEYS)
    if unknown:
        out.append(
            (
                "echomq_django.E003",
                f"ECHOMQ has unknown keys: {', '.join(unknown)}",
                f"Allowed keys: {', '.join(sorted(TOP_KEYS))}.",
            )
        )
    url = os.environ.get("ECHOMQ_URL") or cfg.get("URL")
    alias = cfg.get("CACHE")
    if not url and not alias:
        out.append(
            (
                "echomq_django.E001",
                "ECHOMQ names no Redis connection",
                "Set ECHOMQ['URL'] = 'redis://host:6379/0', or ECHOMQ['CACHE'] to a "
                "Redis cache alias, or the ECHOMQ_URL environment variable.",
            )
        )
    elif url and (not isinstance(url, str) or not url.startswith(URL_SCHEMES)):
        out.append(
            (
                "echomq_django.E002",
                f"ECHOMQ URL {url!r} is not a Redis URL",
                f"It must start with one of {', '.join(URL_SCHEMES)}.",
            )
        )
    elif not url:
        caches_cfg = getattr(settings, "CACHES", {})
        backend = caches_cfg.get(alias, {}).get("BACKEND", "")
        if alias not in caches_cfg:
            out.append(
                (
                    "echomq_django.E004",
                    f"ECHOMQ CACHE {alias!r} is not in CACHES",
                    f"Use one of: {', '.join(caches_cfg) or '(none defined)'}.",
                )
            )
        elif backend != DJANGO_REDIS_CACHE and "django_redis" not in backend:
            out.append(
                (
                    "echomq_django.E005",
                    f"cache {alias!r} uses {backend!r}, not a Redis cache",
                    f"Set its BACKEND to {DJANGO_REDIS_CACHE!r} (Django's own) or "
                    "'django_redis.cache.RedisCache', or use ECHOMQ['URL'].",
                )
            )
        elif "django_redis" in backend and find_spec("django_redis") is None:
            out.append(
                (
                    "echomq_django.E005",
                    f"cache {alias!r} uses {backend!r}, but django-redis is not installed",
                    "pip install 'echomq-django[django-redis]', or use Django's own "
                    f"{DJANGO_REDIS_CACHE!r}.",
                )
            )
    try:
        validate_prefix(cfg.get("PREFIX", "emq"))
    except ValueError as err:
        out.append(("echomq_django.E006", str(err), "Use a short name such as 'emq'."))
    queues = cfg.get("QUEUES", {})
    if not isinstance(queues, dict):
        out.append(
            (
                "echomq_django.E007",
                "ECHOMQ['QUEUES'] must be a dict of queue -> options",
                "Example: {'orders': {'MAX_ATTEMPTS': 3}}",
            )
        )
        queues = {}
    for name, opts in queues.items():
        try:
            validate_queue(name)
        except ValueError as err:
            out.append(("echomq_django.E008", str(err), "Rename the queue in ECHOMQ['QUEUES']."))
        opts = opts or {}
        bad = sorted(set(opts) - QUEUE_KEYS) if isinstance(opts, dict) else ["(not a dict)"]
        if bad:
            out.append(
                (
                    "echomq_django.E009",
                    f"queue {name!r} has unknown options {bad}",
                    f"Allowed: {', '.join(sorted(QUEUE_KEYS))}.",
                )
            )
            continue
        for key, value in opts.items():
            if key in KEEP_KEYS:  # retention (DESIGN §10.2): E020-E023
                out += [
                    (f"echomq_django.{cid}", f"queue {name!r}: {key} {message}", KEEP_HINT)
                    for cid, message in keep_problems(value)
                ]
                continue
            low = 1 if key == "MAX_ATTEMPTS" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                out.append(
                    (
                        "echomq_django.E010",
                        f"queue {name!r}: {key} must be an integer >= {low}, got {value!r}",
                        "MAX_ATTEMPTS counts tries; *_MS are ms.",
                    )
                )
    return out


def build_client(cfg: dict):
    """A redis-py client for the settings: ``RedisCluster`` when CLUSTER is
    true, else ``redis.Redis``; from the URL, or from the cache alias (Django's
    ``RedisCache`` or django-redis's)."""
    import redis
    from redis.cluster import RedisCluster

    url = os.environ.get("ECHOMQ_URL") or cfg.get("URL")
    options = dict(cfg.get("OPTIONS", {}))
    if cfg.get("CLUSTER"):
        if not url:
            raise ImproperlyConfigured("ECHOMQ CLUSTER needs a URL (or ECHOMQ_URL)")
        return RedisCluster.from_url(url, **options)
    if url:
        options.setdefault("health_check_interval", 30)
        return redis.Redis.from_url(url, **options)
    alias = cfg["CACHE"]
    if getattr(settings, "CACHES", {}).get(alias, {}).get("BACKEND") == DJANGO_REDIS_CACHE:
        from django.core.cache import caches

        # Django's RedisCache: its client for writes (the first server), on its pool.
        return caches[alias]._cache.get_client(write=True)
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def get_mq() -> EchoMQ:
    """The process-wide ``EchoMQ`` built from settings (like ``django.core.cache.cache``).

    Raises ``ImproperlyConfigured`` naming every settings problem.
    """
    global _mq
    if _mq is None:
        with _lock:
            if _mq is None:
                cfg = config()
                errors = problems(cfg)
                if errors:
                    raise ImproperlyConfigured("; ".join(f"{i}: {m} ({h})" for i, m, h in errors))
                _mq = EchoMQ(
                    build_client(cfg),
                    prefix=cfg.get("PREFIX", "emq"),
                    queues=cfg.get("QUEUES", {}),
                    max_payload_bytes=cfg.get("MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES),
                )
    return _mq


def reset() -> None:
    """Forget the cached ``EchoMQ`` (after settings or ECHOMQ_URL change)."""
    global _mq
    with _lock:
        _mq = None
