"""What the Redis server named by the settings says against them
(docs/explanation/house.md, "conf/"): the deployment checks ``check
--deploy`` runs and the runners apply before they start (E015-E017, E024;
W018, an evicting server, is a warning), asked of the server once with a
1 s timeout. ``schema.py`` checks the
settings' own shape without connecting.
"""

from __future__ import annotations

import logging
import os

from django.core.exceptions import ImproperlyConfigured

from ..protocol.connection import SENTINEL_SCHEME, CredentialsRefused, redacted, server_facts
from .schema import URL_SCHEMES, config

_warned: set[str] = set()  # warnings check_server logged in this process

CREDENTIALS_HINT = (
    "Put the user and password the server expects in the URL "
    "(redis://user:password@host:6379/0, the password percent-encoded) or in OPTIONS."
)


def server_problems(cfg: dict | None = None) -> list[tuple[str, str, str]]:
    """What the Redis server named by the settings says against them
    (docs/explanation/reliability.md#bad-input-writes-nothing), ids ``echomq_django.E015``-``E017``
    and ``E024``: ``CLUSTER`` on a server that is not a Cluster node (E015), a Cluster node
    without ``CLUSTER`` (E016: "this is a Redis Cluster node: set CLUSTER"), a DB
    index the server does not have (E017), a user or password it refuses
    (E024); and the warning W018, a server that evicts keys (a
    ``maxmemory-policy`` other than ``noeviction``), after them. Connects
    to ``URL`` (or ``ECHOMQ_URL``) with a ``PROBE_TIMEOUT_S`` timeout; says nothing when
    there is no URL, the settings have other problems, or Redis cannot be
    reached (the commands report that themselves)."""
    cfg = config() if cfg is None else cfg
    url = os.environ.get("ECHOMQ_URL") or cfg.get("URL")
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        return []
    shown = redacted(url)
    if url.startswith(SENTINEL_SCHEME):
        return []  # the master moves: the sentinels answer for it at each connection
    cluster = cfg.get("CLUSTER", False)
    if not isinstance(cluster, bool):
        return []
    try:
        options = cfg.get("OPTIONS")
        facts = server_facts(url, client=options if isinstance(options, dict) else None)
    except CredentialsRefused as err:
        message = f"Redis at {shown} refused the URL's credentials: {err}"
        return [("echomq_django.E024", message, CREDENTIALS_HINT)]
    if facts is None:
        return []  # a malformed URL (build_client says so), unreachable, or CONFIG refused
    enabled, databases, db, policy = facts
    out = []
    if cluster and not enabled:
        out.append(
            (
                "echomq_django.E015",
                f"ECHOMQ CLUSTER is True but {shown} is not a Redis Cluster node",
                "Set CLUSTER to False for a single server (or point URL at a Cluster node).",
            )
        )
    elif enabled and not cluster:
        out.append(
            (
                "echomq_django.E016",
                f"{shown}: this is a Redis Cluster node: set CLUSTER",
                "Set ECHOMQ['CLUSTER'] = True: a plain client cannot follow the "
                "Cluster's redirections (MOVED).",
            )
        )
    elif databases is not None and db >= databases:
        out.append(
            (
                "echomq_django.E017",
                f"DB index is out of range: {shown} selects db {db}, the server has "
                f"{databases} (0-{databases - 1})",
                "Use a db index the server has, or raise its 'databases' setting.",
            )
        )
    if policy not in (None, "noeviction"):  # a warning: the settings are not at fault
        out.append(
            (
                "echomq_django.W018",
                f"Redis at {shown} evicts keys (maxmemory-policy {policy}): an evicted "
                "key is a lost job, or a flow that never finishes",
                "Set maxmemory-policy noeviction (CONFIG SET and redis.conf), and give "
                "the server the memory its queues need.",
            )
        )
    return out


def check_server() -> None:
    """For the commands at start (docs/explanation/reliability.md#bad-input-writes-nothing): raise
    ``ImproperlyConfigured`` with the first of ``server_problems()`` (the
    Redis named is not what the settings say: a Cluster node without
    CLUSTER, CLUSTER on a single server, a DB index out of range, refused
    credentials) as one
    line, its hint included; return quietly when it is what they say or
    cannot be reached (the commands' ping reports that). A warning (W018,
    an evicting server) is logged to ``echomq_django`` at WARNING, once
    per process, and the start goes on."""
    every = server_problems()
    for cid, message, hint in every:
        if ".W" in cid and cid not in _warned:
            _warned.add(cid)
            logging.getLogger("echomq_django").warning("%s (%s; %s)", message, cid, hint)
    found = [p for p in every if ".E" in p[0]]
    if found:
        cid, message, hint = found[0]
        raise ImproperlyConfigured(f"{message} ({cid}; {hint})")
