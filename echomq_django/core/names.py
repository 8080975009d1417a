"""The rules for the names inside keys: queue names, job ids, job (handler)
names, group names and the prefix, and the checks that refuse a bad one
before anything is written (docs/explanation/protocol.md#keys).
``core/keyspace.py`` builds the keys from names that passed these.
"""

from __future__ import annotations

import re
import unicodedata

QUEUE_RULE = "a queue name is 1-64 characters from A-Z a-z 0-9 _ . -"
ID_RULE = (
    "a job id is 1-128 characters with no '{', '}', ':', whitespace, control or "
    "format characters (NUL, ESC, bidi overrides, zero-width...) or lone surrogates"
)
NAME_RULE = (
    "a job name (the handler's) is a non-empty string with no control or format "
    "characters (NUL, ESC, bidi overrides, zero-width...) or lone surrogates"
)
PREFIX_RULE = "a prefix is 1-32 characters from A-Z a-z 0-9 _ . -"
GROUP_RULE = ID_RULE.replace("a job id", "a group name", 1)  # the same characters

_QUEUE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_ID_RE = re.compile(r"[^{}:\s]{1,128}\Z")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}\Z")
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Unicode categories refused in ids and names: control, format, surrogate.
_REFUSED = {"Cc": "a control character", "Cf": "a format character", "Cs": "a lone surrogate"}


def refused_char(text: str) -> str | None:
    """Why ``text`` may not be an id or a name, or None: the first control
    or format character or lone surrogate in it, as ``"U+001B (a control
    character)"``. They would hide in logs and the admin, reorder or vanish
    on screen, or (a surrogate) fail to encode after part of a flow landed."""
    if text.isascii():  # the common case: one regex pass
        m = _ASCII_CONTROL.search(text)
        return f"U+{ord(m.group()):04X} (a control character)" if m else None
    for ch in text:
        kind = _REFUSED.get(unicodedata.category(ch))
        if kind:
            return f"U+{ord(ch):04X} ({kind})"
    return None


def validate_queue(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name (docs/explanation/protocol.md#keys).

    Raises ``ValueError`` naming the rule when it is not a ``str`` matching
    ``[A-Za-z0-9_.-]{1,64}``.
    """
    if not isinstance(queue, str) or not _QUEUE_RE.match(queue):
        raise ValueError(f"invalid queue name {queue!r}: {QUEUE_RULE}")
    return queue


def validate_id(job_id: object) -> str:
    """Return ``job_id`` if it is a valid job id (docs/explanation/protocol.md#keys).

    Raises ``ValueError`` naming the rule when it is not a ``str`` of 1-128
    characters without ``{``, ``}``, ``:``, whitespace, control or format
    characters or lone surrogates (docs/explanation/reliability.md#bad-input-writes-nothing).
    """
    if not isinstance(job_id, str) or not _ID_RE.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}: {ID_RULE}")
    bad = refused_char(job_id)
    if bad:
        raise ValueError(f"invalid job id {job_id!r}: it holds {bad}; {ID_RULE}")
    return job_id


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid job name (the handler's).

    Raises ``ValueError`` naming the rule when it is not a non-empty ``str``
    or holds a control or format character or a lone surrogate.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"invalid job name {name!r}: {NAME_RULE}")
    bad = refused_char(name)
    if bad:
        raise ValueError(f"invalid job name {name!r}: it holds {bad}; {NAME_RULE}")
    return name


def validate_group(group: object) -> str:
    """``group`` if valid (it is part of ``P:{q}:g:<group>:...``,
    docs/explanation/protocol.md#groups); else ``ValueError`` naming ``GROUP_RULE``."""
    if not isinstance(group, str) or not _ID_RE.match(group) or refused_char(group):
        raise ValueError(f"invalid group name {group!r}: {GROUP_RULE}")
    return group


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if valid; ``ValueError`` naming the rule otherwise."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid key prefix {prefix!r}: {PREFIX_RULE}")
    return prefix


# QueueKeys field -> the suffix after P:{q}: (one key per queue each).
