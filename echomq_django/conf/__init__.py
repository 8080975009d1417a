"""Settings and the process's ``EchoMQ`` (docs/explanation/house.md, "conf/").

``schema.py`` reads and checks the ``ECHOMQ`` dict; this module builds the
process-wide ``EchoMQ`` from it (``get_mq()``, like
``django.core.cache.cache``). Nothing touches Redis until ``get_mq()`` is
first called; the client is built then, once per process (and again after
``reset()``).
"""

from __future__ import annotations

import os
import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..core.jobs import MAX_PAYLOAD_BYTES
from ..protocol.client import EchoMQ
from ..protocol.connection import (
    SENTINEL_SCHEME,
    connect,
    connect_sentinel,
    parse_sentinel_url,
)
from .schema import (
    DJANGO_REDIS_CACHE,
    config,
    enqueue_when_down,
    json_encoder,
    problems,
    signal_settings,
)
from .server import check_server, server_problems

__all__ = [
    "build_client",
    "check_server",
    "config",
    "enqueue_when_down",
    "get_mq",
    "json_encoder",
    "offline_mq",
    "problems",
    "reset",
    "server_problems",
    "signal_settings",
]

_lock = threading.Lock()
_mq = None
_offline = None


def build_client(cfg: dict):
    """A redis-py client for the settings: ``RedisCluster`` when CLUSTER is
    true, else ``redis.Redis``; from the URL, from Sentinel (a
    ``redis+sentinel://`` URL, or ``SENTINELS`` and ``MASTER_NAME``:
    docs/howto/sentinel.md), or from the cache alias (Django's
    ``RedisCache`` or django-redis's).

    Raises ``RedisUnavailable`` when CLUSTER is set and no startup node
    answers, ``ImproperlyConfigured`` when CLUSTER has no URL."""
    url = os.environ.get("ECHOMQ_URL") or cfg.get("URL")
    options = dict(cfg.get("OPTIONS", {}))
    if cfg.get("CLUSTER"):
        if not url:
            raise ImproperlyConfigured("ECHOMQ CLUSTER needs a URL (or ECHOMQ_URL)")
        return connect(url, True, options)
    if url and url.startswith(SENTINEL_SCHEME):
        sentinels, name, url_options = parse_sentinel_url(url)
        return connect_sentinel(sentinels, name, url_options | options, cfg.get("SENTINEL_KWARGS"))
    if url:
        return connect(url, False, options)
    if cfg.get("SENTINELS"):
        return connect_sentinel(
            cfg["SENTINELS"], cfg["MASTER_NAME"], options, cfg.get("SENTINEL_KWARGS")
        )
    alias = cfg["CACHE"]
    if getattr(settings, "CACHES", {}).get(alias, {}).get("BACKEND") == DJANGO_REDIS_CACHE:
        from django.core.cache import caches

        # Django's RedisCache: its client for writes (the first server), on its pool.
        return caches[alias]._cache.get_client(write=True)
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def get_mq() -> EchoMQ:
    """The process-wide ``EchoMQ`` built from settings (like ``django.core.cache.cache``).

    Raises ``ImproperlyConfigured`` naming every settings problem, and
    ``RedisUnavailable`` when CLUSTER is set and no startup node answers
    (tried again at the next call; ``offline_mq`` checks and encodes
    meanwhile).
    """
    global _mq
    if _mq is None:
        with _lock:
            if _mq is None:
                cfg = _checked_config()
                _mq = _build(cfg, build_client(cfg))
    return _mq


def _checked_config() -> dict:
    """``ECHOMQ`` read; raises ``ImproperlyConfigured`` naming every problem."""
    cfg = config()
    errors = problems(cfg)
    if errors:
        raise ImproperlyConfigured("; ".join(f"{i}: {m} ({h})" for i, m, h in errors))
    return cfg


def _build(cfg: dict, client) -> EchoMQ:
    return EchoMQ(
        client,
        prefix=cfg.get("PREFIX", "emq"),
        queues=cfg.get("QUEUES", {}),
        max_payload_bytes=cfg.get("MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES),
        json_encoder=json_encoder(cfg),
        cross_queue_scripts=cfg.get("CROSS_QUEUE_SCRIPTS", True),
    )


def offline_mq() -> EchoMQ:
    """An ``EchoMQ`` with the settings' prefix, queues, payload limit and
    JSON encoder, built without reaching Redis, for what a producer checks
    and encodes before it writes the commit outbox (names, options,
    payloads, flows) while ``get_mq()`` cannot be built: a Cluster none of
    whose startup nodes answers
    (docs/howto/durable-enqueue.md#outside-a-transaction-too-enqueue_when_down). It never
    sends a command: its client points nowhere Redis is (``offline`` is
    True on it; the outbox pushes with ``get_mq()`` instead). Raises
    ``ImproperlyConfigured`` as ``get_mq()`` does."""
    global _offline
    if _offline is None:
        with _lock:
            if _offline is None:
                cfg = _checked_config()
                # a plain client builds without connecting; no command is sent on it
                mq = _build(cfg, connect("redis://offline.invalid:1/0", False, {}))
                mq.offline = True
                _offline = mq
    return _offline


def reset() -> None:
    """Forget the cached ``EchoMQ`` (after settings or ECHOMQ_URL change)."""
    global _mq, _offline
    with _lock:
        _mq = _offline = None
