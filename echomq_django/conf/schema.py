"""The ``ECHOMQ`` setting, read and checked (docs/explanation/house.md, "conf/").

Shape::

    ECHOMQ = {
        "URL": "redis://127.0.0.1:6379/0",  # or "CACHE": "default" (a Redis cache alias)
        "CLUSTER": False,                   # True: redis.cluster.RedisCluster from URL
        "PREFIX": "emq",
        "QUEUES": {"orders": {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 1000, "LEASE_MS": 30000,
                              # retention (docs/explanation/lifecycle.md): a count, or COUNT / AGE_S
                              "KEEP_COMPLETED": {"COUNT": 1000, "AGE_S": 86400},
                              "KEEP_DEAD": {"COUNT": 10000, "AGE_S": 1209600}}},
        "MAX_PAYLOAD_BYTES": 524288,        # bytes of JSON per payload / result
        "JSON_ENCODER": None,               # or "django.core.serializers.json.DjangoJSONEncoder"
        "ENQUEUE_WHEN_DOWN": "raise",       # or "outbox": Redis away -> the commit outbox
    }

The environment variable ``ECHOMQ_URL``, when set, overrides the connection
(it wins over both ``URL`` and ``CACHE``). Nothing here touches Redis:
``conf/server.py`` asks the server what it is.
"""

from __future__ import annotations

import codecs
import json
import os
from importlib.util import find_spec

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..core.jobs import MAX_LEASE_MS, MAX_PAYLOAD_BYTES
from ..core.keyspace import validate_prefix, validate_queue
from ..core.options import check_concurrency, check_group_rate
from ..core.retention import KEEP_HINT, KEEP_KEYS, keep_problems
from ..core.retry import QUEUE_SETTINGS as RETRY_SETTINGS
from ..core.retry import queue_problems as retry_problems
from ..protocol.connection import SENTINEL_SCHEME, URL_HINT, client_options, redacted, url_flaw
from .sentinel import SENTINEL_KEYS, sentinel_problems
from .timing import timing_problems, whole

TOP_KEYS = {"URL", "CACHE", "CLUSTER", "PREFIX", "QUEUES", "MAX_PAYLOAD_BYTES", "OPTIONS"}
# durable signals (docs/reference/settings.md#top-level-keys):
# key -> (default, lowest allowed, check id)
SIGNAL_KEYS = {
    "SIGNAL_TRIES": (3, 1, "echomq_django.E070"),
    "SIGNAL_BACKOFF_MS": (500, 0, "echomq_django.E071"),
}
TOP_KEYS |= set(SIGNAL_KEYS)
TOP_KEYS |= {"METRICS"}  # metrics.settings_problems checks it
TOP_KEYS |= {"SCHEDULE"}  # periodic jobs: runners/periodic.py
TOP_KEYS |= {"JSON_ENCODER"}  # json_encoder() checks it: E033
TOP_KEYS |= {"ENQUEUE_WHEN_DOWN", "CROSS_QUEUE_SCRIPTS"}  # problems() checks them: E090, E091
TOP_KEYS |= SENTINEL_KEYS  # Redis Sentinel: sentinel.py checks them, E060-E064
# What a plain enqueue / add_flow outside a transaction does while Redis is
# away (docs/howto/durable-enqueue.md#outside-a-transaction-too-enqueue_when_down).
ENQUEUE_WHEN_DOWN = ("raise", "outbox")
QUEUE_KEYS = {"MAX_ATTEMPTS", "BACKOFF_MS", "LEASE_MS", "KEEP_COMPLETED", "KEEP_DEAD"}
QUEUE_KEYS |= {"RATE_LIMIT", "TIMEOUT_MS", "CONCURRENCY", "KEEP_LOGS"}  # KEEP_LOGS: live.py, E019
QUEUE_KEYS |= {"GROUP_CONCURRENCY", "GROUP_RATE_LIMIT"}  # protocol.md#groups: E080, E081
KEEP_LOGS_MAX = 10_000  # a job log's bound, at most (lines)
QUEUE_KEYS |= set(RETRY_SETTINGS)  # retry policies and expiry: core/retry.queue_problems
RUNTIME_KEYS = {"RATE_LIMIT", "TIMEOUT_MS"}  # checked by timing.timing_problems (E050, E051, E059)
URL_SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
CAP_HINT = (
    "CONCURRENCY caps the queue's jobs active at once across all workers, e.g. 3; "
    "leave it out for no cap."
)
GROUP_CAP_HINT = "a cap per group such as 2, or leave GROUP_CONCURRENCY out for none."
GROUP_RATE_HINT = 'e.g. {"MAX": 10, "PER_MS": 1000}: 10 jobs of one group started a second.'
GROUP_CHECKS = {  # key -> (check, id, hint)
    "GROUP_CONCURRENCY": (check_concurrency, "echomq_django.E080", GROUP_CAP_HINT),
    "GROUP_RATE_LIMIT": (check_group_rate, "echomq_django.E081", GROUP_RATE_HINT),
}
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


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

    if cfg is None and not isinstance(value := getattr(settings, "ECHOMQ", {}), dict):
        return [("echomq_django.E026", f"ECHOMQ must be a dict, got {type(value).__name__}",
                 "Example: ECHOMQ = {'URL': 'redis://127.0.0.1:6379/0'}.")]  # fmt: skip
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
    url = (env_url := os.environ.get("ECHOMQ_URL")) or cfg.get("URL")  # it wins: URL, CACHE
    alias = cfg.get("CACHE")
    if cfg.get("URL") and alias:  # URL would win, silently: the cache is not what it uses
        out.append(
            (
                "echomq_django.E025",
                f"ECHOMQ sets both URL and CACHE ({alias!r}): name one connection",
                "URL would win and CACHE be ignored: drop one of them (the ECHOMQ_URL "
                "environment variable may still override either, as a deployment's).",
            )
        )
    out += sentinel_problems(cfg, url)
    if not url and not alias and "SENTINELS" not in cfg:
        out.append(
            (
                "echomq_django.E001",
                "ECHOMQ names no Redis connection",
                "Set ECHOMQ['URL'] = 'redis://host:6379/0', or ECHOMQ['CACHE'] to a "
                "Redis cache alias, or SENTINELS and MASTER_NAME, or the ECHOMQ_URL "
                "environment variable.",
            )
        )
    elif not url and not alias:
        pass  # Sentinel: sentinel_problems said it all
    elif url and (not isinstance(url, str) or not url.startswith(URL_SCHEMES)):
        where = "ECHOMQ_URL (the environment variable)" if env_url else "ECHOMQ URL"
        out.append(
            (
                "echomq_django.E002",
                f"{where} {redacted(url)!r} is not a Redis URL",
                f"It must start with one of {', '.join(URL_SCHEMES)}.",
            )
        )
    elif url and (flaw := url_flaw(url)):
        where = "ECHOMQ_URL (the environment variable)" if env_url else "ECHOMQ URL"
        message = f"{where} {redacted(url)!r} is not a Redis URL: {flaw}"
        out.append(("echomq_django.E002", message, URL_HINT))
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
        out += retry_problems(name, opts)  # docs/howto/retries.md: E110-E113
        for key, value in opts.items():
            if key in RUNTIME_KEYS or key in RETRY_SETTINGS:
                continue
            if key == "KEEP_LOGS":
                out += keep_logs_problems(name, value)
                continue
            if key == "CONCURRENCY":  # docs/explanation/protocol.md#concurrency
                try:
                    check_concurrency(value)
                except ValueError as err:
                    out.append(("echomq_django.E018", f"queue {name!r}: {err}", CAP_HINT))
                continue
            if key in GROUP_CHECKS:  # docs/explanation/protocol.md#groups: E080, E081
                check, cid, hint = GROUP_CHECKS[key]
                try:
                    check(value)
                except ValueError as err:
                    out.append((cid, f"queue {name!r}: {key}: {err}", hint))
                continue
            if key in KEEP_KEYS:  # retention (docs/explanation/lifecycle.md): E020-E023
                out += [
                    (f"echomq_django.{cid}", f"queue {name!r}: {key} {message}", KEEP_HINT)
                    for cid, message in keep_problems(value)
                ]
                continue
            low = 1 if key == "MAX_ATTEMPTS" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                least = 1 if key == "LEASE_MS" else low  # a lease of 0 is E011's
                out.append(
                    (
                        "echomq_django.E010",
                        f"queue {name!r}: {key} must be an integer >= {least}, got {value!r}",
                        "MAX_ATTEMPTS counts tries; *_MS are ms.",
                    )
                )
    for key, (_default, low, cid) in SIGNAL_KEYS.items():
        value = cfg.get(key, low)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            out.append(
                (
                    cid,
                    f"ECHOMQ['{key}'] must be an integer >= {low}, got {value!r}",
                    "SIGNAL_TRIES counts sends to a receiver that raises before the event is "
                    "dead-lettered; SIGNAL_BACKOFF_MS is the ms before the second, doubling.",
                )
            )
    try:
        json_encoder(cfg)
    except ImproperlyConfigured as err:
        out.append(
            (
                "echomq_django.E033",
                str(err),
                "Use 'django.core.serializers.json.DjangoJSONEncoder' (dates, Decimal, UUID), "
                "another json.JSONEncoder subclass, or None for plain JSON.",
            )
        )
    when_down = cfg.get("ENQUEUE_WHEN_DOWN", "raise")
    allowed = ", ".join(map(repr, ENQUEUE_WHEN_DOWN))
    if when_down not in ENQUEUE_WHEN_DOWN:
        out.append(
            (
                "echomq_django.E090",
                f"ECHOMQ ENQUEUE_WHEN_DOWN must be one of {allowed}, got {when_down!r}",
                "'raise' (the default): enqueue raises RedisUnavailable while Redis is away; "
                "'outbox': it writes the job to the commit outbox, which the worker and the "
                "pump push once Redis answers (needs ./manage.py migrate).",
            )
        )
    if not isinstance(across := cfg.get("CROSS_QUEUE_SCRIPTS", True), bool):
        hint = "False keeps every script on its own queue's keys (a proxy over several servers)."
        message = f"ECHOMQ CROSS_QUEUE_SCRIPTS must be True or False, got {across!r}"
        out.append(("echomq_django.E091", message, hint))
    return out + value_problems(cfg) + timing_problems(cfg)


def keep_logs_problems(queue: str, value) -> list[tuple[str, str, str]]:
    """``echomq_django.E019`` when a queue's ``KEEP_LOGS`` is not an int from 1
    to ``KEEP_LOGS_MAX`` (docs/howto/progress-and-logs.md#keep_logs)."""
    if whole(value, 1, KEEP_LOGS_MAX):
        return []
    return [
        (
            "echomq_django.E019",
            f"queue {queue!r}: KEEP_LOGS must be an integer from 1 to {KEEP_LOGS_MAX}, "
            f"got {value!r}",
            "KEEP_LOGS is the lines each job's log keeps (the newest); the default is 100.",
        )
    ]


def enqueue_when_down() -> str:
    """``ECHOMQ["ENQUEUE_WHEN_DOWN"]``: ``"raise"`` (the default) or
    ``"outbox"`` (docs/howto/durable-enqueue.md#outside-a-transaction-too-enqueue_when_down).
    Raises ``ImproperlyConfigured`` for any other value (check id
    ``echomq_django.E090``)."""
    value = config().get("ENQUEUE_WHEN_DOWN", "raise") if settings.configured else "raise"
    if value not in ENQUEUE_WHEN_DOWN:
        raise ImproperlyConfigured(
            f"ECHOMQ ENQUEUE_WHEN_DOWN must be one of {', '.join(map(repr, ENQUEUE_WHEN_DOWN))}, "
            f"got {value!r} (echomq_django.E090)"
        )
    return value


# A payload or result is one Redis string: at most 512 MiB.
PAYLOAD_LIMIT_BYTES = 512 * 1024 * 1024


def value_problems(cfg: dict) -> list[tuple[str, str, str]]:
    """Settings whose type passes but whose value would misbehave at run time
    (docs/explanation/reliability.md#bad-input-writes-nothing), ids ``echomq_django.E011``-``E014``:
    a ``LEASE_MS`` of 0 (a claimed job with no holder), ``MAX_PAYLOAD_BYTES`` that is not a
    whole number of bytes in 1..512 MiB, ``OPTIONS`` the redis-py client
    does not take, a ``CLUSTER`` that is not a bool. Settings only, no I/O."""
    out = []
    queues = cfg.get("QUEUES", {})
    for name, opts in queues.items() if isinstance(queues, dict) else ():
        lease = opts.get("LEASE_MS") if isinstance(opts, dict) else None
        if isinstance(lease, int) and not isinstance(lease, bool) and lease == 0:
            why = "A lease of 0 ms expires as it is taken: a claimed job would be active with no "
            out.append(("echomq_django.E011", f"queue {name!r}: LEASE_MS must be a whole number "
                        "of ms >= 1, got 0", why + "holder. The default is 30000."))  # fmt: skip
        elif isinstance(lease, int) and not isinstance(lease, bool) and lease > MAX_LEASE_MS:
            out.append(("echomq_django.E011", f"queue {name!r}: LEASE_MS must be at most "
                        f"{MAX_LEASE_MS} ms (365 days), got {lease}", "A dead worker's job waits "
                        "its lease before it runs again. The default is 30000."))  # fmt: skip
    size = cfg.get("MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= PAYLOAD_LIMIT_BYTES:
        out.append(
            (
                "echomq_django.E012",
                f"ECHOMQ MAX_PAYLOAD_BYTES must be a whole number of bytes from 1 to "
                f"{PAYLOAD_LIMIT_BYTES} (512 MiB, a Redis string's limit), got {size!r}",
                f"Use an int such as {MAX_PAYLOAD_BYTES} (the default).",
            )
        )
    cluster = cfg.get("CLUSTER", False)
    if not isinstance(cluster, bool):
        out.append(
            (
                "echomq_django.E014",
                f"ECHOMQ CLUSTER must be True or False, got {cluster!r}",
                "True when URL names a node of a Redis Cluster.",
            )
        )
    options = cfg.get("OPTIONS", {})
    if not isinstance(options, dict):
        out.append(
            (
                "echomq_django.E013",
                f"ECHOMQ OPTIONS must be a dict of redis-py client arguments, got "
                f"{type(options).__name__}",
                "Example: {'socket_timeout': 5}.",
            )
        )
    else:
        allowed = client_options(cluster is True)
        unknown = sorted(str(k) for k in options if k not in allowed)
        if unknown:
            kind = "RedisCluster" if cluster is True else "redis.Redis"
            out.append(
                (
                    "echomq_django.E013",
                    f"ECHOMQ OPTIONS has arguments {kind} does not take: {', '.join(unknown)}",
                    "Use keyword arguments of the redis-py client, such as socket_timeout, "
                    "socket_connect_timeout, retry_on_timeout, health_check_interval, "
                    "ssl_cert_reqs, username, password.",
                )
            )
        out += [("echomq_django.E013", f"ECHOMQ OPTIONS {flaw}", OPTIONS_HINT)
                for flaw in option_flaws(options, cfg)]  # fmt: skip
    return out


OPTIONS_HINT = "Values as redis-py takes them, e.g. {'socket_timeout': 5, 'protocol': 3}."


def option_flaws(options: dict, cfg: dict) -> list[str]:
    """What is wrong with the values of the ``OPTIONS`` redis-py would take
    only at the first call (a timeout of 0 fails every call as if Redis were
    down), and ``OPTIONS`` beside ``CACHE`` without a URL (the cache's
    client is the cache's: they would be ignored)."""
    out = []
    for key in ("socket_timeout", "socket_connect_timeout"):
        value = options.get(key)
        if value is not None and (not _number(value) or not 0 < value < 10**9):
            out.append(f"{key} must be None or a number of seconds > 0, got {value!r}")
    value = options.get("health_check_interval", 0)
    if not _number(value) or not 0 <= value < 10**9:
        out.append(f"health_check_interval must be a number of seconds >= 0, got {value!r}")
    if options.get("protocol", 2) not in (2, 3) or isinstance(options.get("protocol"), bool):
        out.append(f"protocol must be 2 or 3 (RESP2, RESP3), got {options['protocol']!r}")
    if "encoding" in options:
        try:
            codecs.lookup(options["encoding"])
        except (LookupError, TypeError):
            out.append(f"encoding must name a Python codec, got {options['encoding']!r}")
    url = os.environ.get("ECHOMQ_URL") or cfg.get("URL")
    if options and cfg.get("CACHE") and not url:
        out.append("is ignored with CACHE: the cache's client has its own (set them in CACHES)")
    return out


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def signal_settings() -> dict[str, int]:
    """``{"SIGNAL_TRIES": n, "SIGNAL_BACKOFF_MS": ms}`` from ``ECHOMQ``, defaults
    filled in (3 tries, 500 ms); the defaults when Django is not configured."""
    cfg = config() if settings.configured else {}
    return {key: cfg.get(key, default) for key, (default, _low, _cid) in SIGNAL_KEYS.items()}


def json_encoder(cfg: dict | None = None) -> type[json.JSONEncoder] | None:
    """The ``JSON_ENCODER`` setting's class (payloads and results are encoded
    with it), or None for plain JSON. Raises
    ``ImproperlyConfigured`` when it is not the dotted path of a
    ``json.JSONEncoder`` subclass."""
    path = (config() if cfg is None else cfg).get("JSON_ENCODER")
    if path is None:
        return None
    try:
        found = import_string(path) if isinstance(path, str) else path
    except ImportError as err:
        raise ImproperlyConfigured(f"ECHOMQ JSON_ENCODER {path!r} does not import: {err}") from None
    if not (isinstance(found, type) and issubclass(found, json.JSONEncoder)):
        raise ImproperlyConfigured(
            f"ECHOMQ JSON_ENCODER {path!r} is not a json.JSONEncoder subclass"
        )
    return found
