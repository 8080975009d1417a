"""The Redis Sentinel settings, checked (docs/howto/sentinel.md): ``SENTINELS``,
``MASTER_NAME`` and ``SENTINEL_KWARGS`` (django-rq's shape), or a
``redis+sentinel://`` URL. Settings only, no I/O: ``schema.problems`` adds
what this finds to the system checks, ids ``echomq_django.E060``-``E064``.
"""

from __future__ import annotations

from ..protocol.connection import SENTINEL_SCHEME, SENTINEL_URL_RULE, parse_sentinel_url

SENTINEL_KEYS = {"SENTINELS", "MASTER_NAME", "SENTINEL_KWARGS"}
EXAMPLE = (
    "Example: 'SENTINELS': [('10.0.0.1', 26379), ('10.0.0.2', 26379), ('10.0.0.3', 26379)], "
    "'MASTER_NAME': 'mymaster'."
)


def _pair(item) -> bool:
    if not isinstance(item, list | tuple) or len(item) != 2:
        return False
    host, port = item
    return (
        isinstance(host, str)
        and bool(host)
        and isinstance(port, int)
        and not isinstance(port, bool)
        and 1 <= port <= 65535
    )


def sentinel_problems(cfg: dict, url: str | None) -> list[tuple[str, str, str]]:
    """``(check id, message, hint)`` for each problem of the Sentinel
    settings in ``cfg`` (the ``ECHOMQ`` dict); ``url`` is the URL in force
    (``ECHOMQ_URL`` or ``URL``). E060: ``SENTINELS`` without ``MASTER_NAME``,
    or ``MASTER_NAME`` / ``SENTINEL_KWARGS`` without ``SENTINELS``; E061:
    ``SENTINELS`` is not a non-empty list of ``(host, port)`` pairs; E062:
    ``MASTER_NAME`` is not a non-empty string or ``SENTINEL_KWARGS`` not a
    dict; E063: ``SENTINELS`` beside ``URL``, ``CACHE`` or ``CLUSTER`` (or a
    Sentinel URL with ``CLUSTER``); E064: a ``redis+sentinel://`` URL that
    does not parse."""
    out = []
    given = SENTINEL_KEYS & set(cfg)
    if "SENTINELS" in given and "MASTER_NAME" not in given:
        out.append(
            (
                "echomq_django.E060",
                "ECHOMQ SENTINELS is set without MASTER_NAME",
                "Name the master the sentinels monitor (their 'sentinel monitor <name> ...' "
                f"line). {EXAMPLE}",
            )
        )
    elif given and "SENTINELS" not in given:
        out.append(
            (
                "echomq_django.E060",
                f"ECHOMQ {' and '.join(sorted(given))} set without SENTINELS",
                f"List the sentinels to ask for the master. {EXAMPLE}",
            )
        )
    sentinels = cfg.get("SENTINELS")
    if "SENTINELS" in cfg and (
        not isinstance(sentinels, list | tuple) or not sentinels or not all(map(_pair, sentinels))
    ):
        out.append(
            (
                "echomq_django.E061",
                f"ECHOMQ SENTINELS must be a non-empty list of (host, port) pairs, got "
                f"{sentinels!r}",
                f"A port is a whole number from 1 to 65535 (often 26379). {EXAMPLE}",
            )
        )
    name, kwargs = cfg.get("MASTER_NAME"), cfg.get("SENTINEL_KWARGS", {})
    if ("MASTER_NAME" in cfg and (not isinstance(name, str) or not name)) or not isinstance(
        kwargs, dict
    ):
        out.append(
            (
                "echomq_django.E062",
                f"ECHOMQ MASTER_NAME must be a non-empty string and SENTINEL_KWARGS a dict, got "
                f"{name!r} and {kwargs!r}",
                "SENTINEL_KWARGS holds the sentinels' own client arguments, e.g. "
                "{'password': '...', 'socket_timeout': 0.5}; the master's go in OPTIONS.",
            )
        )
    others = sorted({"URL", "CACHE", "CLUSTER"} & {k for k, v in cfg.items() if v})
    sentinel_url = isinstance(url, str) and url.startswith(SENTINEL_SCHEME)
    if "SENTINELS" in cfg and others:
        out.append(
            (
                "echomq_django.E063",
                f"ECHOMQ SENTINELS is set beside {', '.join(others)}: name one connection",
                "Sentinel finds the master itself: drop URL and CACHE; Sentinel serves a "
                "single master, not a Redis Cluster (drop CLUSTER).",
            )
        )
    elif sentinel_url and cfg.get("CLUSTER"):
        out.append(
            (
                "echomq_django.E063",
                "ECHOMQ URL is a Sentinel URL but CLUSTER is set",
                "Sentinel serves a single master, not a Redis Cluster: drop CLUSTER.",
            )
        )
    if sentinel_url:
        try:
            parse_sentinel_url(url)
        except ValueError as err:
            out.append(("echomq_django.E064", str(err), f"Write it as {SENTINEL_URL_RULE}."))
    return out
