"""A job row's field names and the reads that take a row of any version
(docs/explanation/protocol.md#short-field-names).

The short names are spelled here once for the host as ``lua/lib/row.lua``
spells them for the scripts; a row an earlier version wrote holds some of
them under their long names, and every read here takes the short name's
value, else the long one's. Imports nothing of the package.
"""

from __future__ import annotations

import re
from typing import Any


def to_text(value: Any) -> str | None:
    """A Redis reply value (bytes or str, or None) as text."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


# The short names of a row's most common fields, spelled once here as
# lua/lib/row.lua spells them for the scripts, and the long names rows of an
# earlier version hold (docs/explanation/protocol.md#the-job-row).
NAME, PAYLOAD, STATE, CREATED, PARENT = "n", "d", "s", "ca", "p"
PARENT_QUEUE, POLICY, PARENT_INC = "pq", "pp", "pi"
# a parent's children, counted, on a row whose :children list holds a range
# (child_entries; written only so, and new: no long name)
KIDS = "cn"
LONG_NAMES = {
    NAME: "name",
    PAYLOAD: "payload",
    STATE: "state",
    PARENT: "parent",
    CREATED: "created_at",
    PARENT_QUEUE: "parent_queue",
    POLICY: "parent_policy",
    PARENT_INC: "parent_inc",
}


def row_fields(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` (a row's field names as written now) plus the long name of
    each renamed one, for one ``HMGET`` that reads rows of either version;
    ``pick_fields`` folds its reply back to ``names``' order."""
    return names + tuple(LONG_NAMES[n] for n in names if n in LONG_NAMES)


def pick_fields(names: tuple[str, ...], values: list) -> list:
    """The ``HMGET`` reply ``values`` of ``row_fields(names)`` as one value
    per name (the short name's, else the long name's; None when neither)."""
    out, extra = list(values[: len(names)]), len(names)
    for i, n in enumerate(names):
        if n in LONG_NAMES:
            if out[i] is None:
                out[i] = values[extra]
            extra += 1
    return out


REL_PREFIX = 12  # bytes of a child's id a relative parent ref stands for (lua/lib/row.lua)


def parent_link(job_id: str, stored: Any, queue: Any = None) -> tuple[str | None, str | None]:
    """``(parent id, parent queue)`` of job ``job_id`` from its row's ``p``
    and ``pq`` values (raw, or None; the queue None: the child's own).
    ``p`` is ``[<queue>:]<id>`` or ``[<queue>:]:<rest>``, the rest of an id
    that starts with the child's first ``REL_PREFIX`` bytes
    (lua/lib/row.lua ``parent_ref``; neither a queue name nor an id holds
    ``:``); a row written before the queue went into ``p`` holds it as
    ``pq`` (``queue``). docs/explanation/protocol.md#relative-parent-ids"""
    text, queue = to_text(stored), to_text(queue)
    if text and text[0] != ":" and ":" in text:
        queue, text = text.split(":", 1)
    if text and text[0] == ":":  # cut where no character is split (parent_ref)
        return (job_id.encode()[:REL_PREFIX] + text[1:].encode()).decode(), queue
    return text, queue


def id_head(job_id: str) -> str | None:
    """The first ``REL_PREFIX`` bytes of ``job_id`` as text, or None: the id
    is shorter, or the cut would split a character (no id is then stored
    relative to it: lua/lib/row.lua ``rel_rest``)."""
    head = job_id.encode()[:REL_PREFIX]
    if len(head) < REL_PREFIX:
        return None
    try:
        return head.decode()
    except UnicodeDecodeError:
        return None


def serial_ids(head: str, low: str, high: str) -> list[str]:
    """The ids ``head`` + each hex serial from ``low`` to ``high`` (hex text,
    both included): a ``:children`` range (``child_entries``) or an events
    run's ``::<low>:<high>`` part (``core.events.run_ids``)."""
    return [f"{head}{n:x}" for n in range(int(low, 16), int(high, 16) + 1)]


def pending_ids(entries: list) -> list[str]:
    """The ids a queue's ``pending`` list entries (bytes or text, in order)
    stand for: a range entry ``<first id>:<last hex serial>`` is the first
    id's ``REL_PREFIX``-byte head and each serial from the first id's up to
    the last (lua/lib/pending.lua); any other entry is one id.
    docs/explanation/protocol.md#ranges-in-pending"""
    out: list[str] = []
    for entry in entries:
        raw = entry if isinstance(entry, bytes) else entry.encode()
        first, cut, last = raw.partition(b":")
        if not cut:
            out.append(raw.decode())
            continue
        head = first[:REL_PREFIX].decode()
        out += serial_ids(head, first[REL_PREFIX:].decode(), last.decode())
    return out


RANGE_MAX = 100  # children one range entry of a :children list stands for at most
_SERIAL = re.compile(r"(?:0|[1-9a-f][0-9a-f]{0,11})\Z")  # lua/lib/row.lua hex_of
_SERIAL_TOP = 0xFFFFFFFFFFFF  # the last serial of 12 hex digits: a run ends there


def child_entries(queue: str, parent_id: str, pairs: list[tuple[str, str]]) -> list[str]:
    """The ``:children`` entries of parent ``parent_id`` on ``queue`` for
    children given as ``(queue, id)`` pairs, in order, as lua/lib/row.lua
    reads them: ``:`` and the rest of an id that shares the parent's first
    ``REL_PREFIX`` bytes (``<queue>::`` and the rest on another queue),
    else the id (``<queue>:<id>`` on another queue); and 3 to ``RANGE_MAX``
    such children in a row on one queue whose rests count up by one in hex
    (a flow's generated ids) as one range, ``:<a>:<b>`` /
    ``<queue>::<a>:<b>``. A list holding a range has its count on the
    parent's row (``KIDS``: ``enqueue_flow`` writes it).
    docs/explanation/protocol.md#a-parents-keys"""
    head = id_head(parent_id) or "\0"  # NUL: in no id, so nothing is cut
    out: list[str] = []
    add = out.append
    run = False  # a run being read: its queue, first and last serial, the rest it takes next
    run_q, low, last, follow = "", 0, 0, None

    def close() -> None:
        lead = ":" if run_q == queue else run_q + "::"
        if last - low >= 2:
            add(f"{lead}{low:x}:{last:x}")
        else:
            out.extend(f"{lead}{n:x}" for n in range(low, last + 1))

    for q, i in pairs:
        rest = i.removeprefix(head)
        relative = 0 < len(rest) < len(i)  # (its byte 13 starts a character: head is whole ones)
        if run and relative and rest == follow and q == run_q and last - low + 1 < RANGE_MAX:
            last += 1
            follow = f"{last + 1:x}" if last < _SERIAL_TOP else None
            continue
        if run:
            close()
            run = False
        if not relative:
            add(i if q == queue else q + ":" + i)
        elif _SERIAL.match(rest):
            run, run_q, low = True, q, int(rest, 16)
            last, follow = low, f"{low + 1:x}" if low < _SERIAL_TOP else None
        else:
            add(":" + rest if q == queue else q + "::" + rest)
    if run:
        close()
    return out


# A job added as pending holds no state field: a row with a handler and no
# state is pending, as lua/lib/row.lua's state reads take it
# (docs/explanation/protocol.md#compact-rows).
PENDING = "pending"


def row_state(values: list) -> Any:
    """The raw state (or None: no such row) in the reply of
    ``HMGET <row> *STATE_FIELDS``, a row of either version; ``"pending"``
    for a row added as pending (it holds its handler, every row does, but
    no state). docs/explanation/protocol.md#compact-rows"""
    state, name = pick_fields((STATE, NAME), values)
    return PENDING if state is None and name is not None else state


# the state of a row of either version, and its handler (every row holds
# one: a row without a state is pending), one HMGET
STATE_FIELDS = row_fields((STATE, NAME))


def created_of(created: Any, parent_inc: Any) -> str | None:
    """A row's add time (ms, as text; None for none) from its ``ca`` and
    ``pi`` values (raw, or None): a child written at its flow's add time
    holds no ``ca``, its parent's incarnation carries the time before its
    last 6 digits (lua/lib/row.lua ``created_of``).
    docs/explanation/protocol.md#compact-rows"""
    if created is not None:
        return to_text(created)
    inc = to_text(parent_inc)
    return inc[:-6] if inc and len(inc) > 6 else None


def row_get(r: dict, name: str) -> Any:
    """Field ``name`` (a short name) of a decoded row ``r`` (str keys), or
    the long name's value a row of an earlier version holds; None for none."""
    value = r.get(name)
    return r.get(LONG_NAMES[name]) if value is None and name in LONG_NAMES else value
