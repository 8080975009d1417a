"""Outbox entries as the pump reads them (DESIGN §6; issue 17, item 6).

An entry is the JSON a child's transition pushed onto its queue's outbox
(``{k, c, p, q, pol?, v?}``, lib/flow.lua and lib/lifecycle.lua). Anything
else there (written by hand, by an older version, garbled) is poison: the
pump must dead-letter it with what is wrong with it, never die of it, and
never let it block the entries behind it. ``parse_entry`` says what is
wrong; ``deliver_batch`` delivers a batch and isolates an entry the scripts
refuse.
"""

from __future__ import annotations

import json

import redis

from ..core.exceptions import RedisUnavailable
from ..core.jobs import Outcome, Policy
from ..core.keyspace import validate_id, validate_queue
from ..protocol.client import EchoMQ
from ..protocol.errors import TRANSIENT, connection_error

ENTRY_KINDS = ("done", "dead", "reattach", "gone", "rm", "cancel")  # lua/deliver_to_parents.lua

# "Not now", never "no": a failover or a dropped connection, however redis-py
# words it (its Cluster client gives up with ClusterError, "TTL exhausted", or a
# RedisClusterException while its slot map heals). Such a refusal says nothing
# about the entry: it stays in the outbox for the next sweep, neither counted
# as a try nor dead-lettered.
NOT_NOW = (
    *TRANSIENT,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


def parse_entry(raw) -> tuple[dict | None, str | None]:
    """One outbox entry as read: ``(entry, None)`` when it has the shape
    ``deliver_to_parents`` takes (``{k, c, p, q, pol?, v?}``), else ``(None,
    reason)``, the reason naming what is wrong (issue 17, item 6: a poison
    entry is dead-lettered with it, never crashes the pump)."""
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"malformed entry: not JSON ({err})"
    if not isinstance(entry, dict):
        return None, f"malformed entry: a JSON {type(entry).__name__}, not an object"
    if entry.get("k") not in ENTRY_KINDS:
        return None, f"malformed entry: kind {entry.get('k')!r} is not one of {ENTRY_KINDS}"
    for name in ("c", "p", "q"):
        if not isinstance(entry.get(name), str):
            return None, f"malformed entry: {name!r} is {entry.get(name)!r}, not a string"
    for name in ("pol", "v"):
        if entry.get(name) is not None and not isinstance(entry[name], str):
            return None, f"malformed entry: {name!r} is {entry[name]!r}, not a string"
    if entry.get("pol") and entry["pol"] not in set(Policy):
        return None, f"malformed entry: policy {entry['pol']!r} is not one of {sorted(Policy)}"
    try:
        validate_queue(entry["q"])
        validate_id(entry["p"])
    except ValueError as err:
        return None, f"malformed entry: {err}"
    return entry, None


def deliver_batch(mq: EchoMQ, raw: list, outcome: Outcome, source: str) -> tuple[list, list]:
    """Deliver the outbox entries ``raw`` (as read from ``source``'s outbox,
    a queue name); returns the parsed
    entries (None for a poison one) and a verdict per entry: True
    (delivered), False (its parent is gone: tried again later), None
    (delivered, but no replica of its parent's Cluster master confirmed it
    in time: it stays in the outbox, ``EchoMQ.deliver``) or a reason
    text (poison: dead-letter it now). A batch the scripts refuse (data no
    check foresaw) is delivered again one entry at a time, so only the entry
    at fault is dead-lettered, with Redis' words. Merges what moved into
    ``outcome``; raises ``RedisUnavailable`` (the pump waits it out) for a
    transient failure (``NOT_NOW``), of the batch or of one entry: no entry
    is dead-lettered for it."""
    parsed = [parse_entry(item) for item in raw]
    entries = [entry for entry, _ in parsed]
    verdicts: list = [reason for _, reason in parsed]
    good = [i for i, entry in enumerate(entries) if entry is not None]
    try:
        flags, moved = mq.deliver([entries[i] for i in good], source=source)
        outcome.merge(moved)
    except RedisUnavailable:
        raise
    except NOT_NOW as err:
        raise connection_error(mq.client, err) from err
    except Exception:
        flags = []
        for i in good:
            try:
                [flag], moved = mq.deliver([entries[i]], source=source)
                outcome.merge(moved)
            except RedisUnavailable:
                raise
            except NOT_NOW as err:
                raise connection_error(mq.client, err) from err
            except Exception as err:
                flag = f"delivery refused: {type(err).__name__}: {err}"
            flags.append(flag)
    for i, flag in zip(good, flags, strict=True):
        verdicts[i] = flag if flag is None or isinstance(flag, str) else bool(flag)
    return entries, verdicts
