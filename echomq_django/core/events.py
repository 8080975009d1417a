"""What a follower of the queues' events stream is handed, and the rules
for what it asks (docs/howto/events.md#what-an-event-holds).

``Event`` is one entry of a queue's events stream (``P:{q}:events``, one
per job it names); ``Gap`` tells a follower that it fell behind the
stream's cap and entries may be gone. ``check_follow`` validates a
follow's arguments before any Redis I/O, each error naming its rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .keyspace import validate_queue
from .refs import JobRef
from .rows import id_head, serial_ids

# The kinds the scripts write (docs/explanation/protocol.md#events), the
# pause switch's two included.
KINDS = frozenset(
    {
        "added",
        "active",
        "progress",
        "completed",
        "failed",
        "dead",
        "released",
        "cancelling",
        "cancelled",
        "removed",
        "promoted",
        "postponed",
        "waiting_children",
        "stalled",
        "retried",
        "reattached",
        "paused",
        "resumed",
    }
)
GAP = "gap"  # the kind of a Gap: never a stream entry's
STREAM_ID = re.compile(r"[0-9]{1,20}(-[0-9]{1,20}(:[0-9]{1,9})?)?")
STREAM_ID_RULE = (
    "a stream id is '<ms>-<seq>' or '<ms>', each an ASCII integer below 2**64, "
    "e.g. '1700000000000-0', or an event's id '<ms>-<seq>:<k>' (the k-th event of "
    "an entry naming several jobs)"
)
MAX_FOLLOWED = 64  # queues one follow reads at most (one reader thread per slot)


def run_ids(text: str) -> list[str]:
    """The job ids an events entry's ``id`` field ``text`` names, whole:
    space-separated, the first whole, each later one either whole, ``:``
    and the rest of an id that shares the first's ``rows.REL_PREFIX``
    bytes, or ``::<a>:<b>``, the ids whose rests count from hex ``a`` to
    ``b`` (``run_text`` in lua/lib/emit.lua; an id never holds ``:``, and
    the cut splits no character). An entry written before holds every id
    whole and reads as ever. docs/explanation/protocol.md#relative-ids-in-a-run"""
    parts = text.split(" ")
    if ":" not in text:
        return parts
    head = id_head(parts[0]) or ""  # None: no later id was written relative to it
    ids: list[str] = []
    for part in parts:
        if part[:2] == "::":
            low, high = part[2:].split(":")
            ids.extend(serial_ids(head, low, high))
        else:
            ids.append(head + part[1:] if part[:1] == ":" else part)
    return ids


def id_key(stream_id: str) -> tuple[int, int]:
    """``"<ms>-<seq>"`` (or ``"<ms>"``) as a sortable pair of ints; an event's
    id (``"<ms>-<seq>:<k>"``) as its entry's."""
    ms, _, seq = stream_id.partition(":")[0].partition("-")
    return int(ms), int(seq or 0)


def event_id(entry_id: str, k: int, n: int) -> str:
    """The id of the ``k``-th (from 0) of the ``n`` events of stream entry
    ``entry_id``: the entry's id when it holds one event, else
    ``"<entry id>:<k>"``, so that resuming after an event
    (``since=event.id``) yields the entry's later events and nothing twice.
    docs/howto/events.md#resume-where-you-stopped"""
    return entry_id if n == 1 else f"{entry_id}:{k}"


def split_event_id(since: str) -> tuple[str, int | None]:
    """``(entry id, k)`` of an event's id ``"<ms>-<seq>:<k>"``; ``(since,
    None)`` for a plain stream id (after the whole entry)."""
    entry, cut, k = since.partition(":")
    return entry, (int(k) if cut else None)


@dataclass(frozen=True)
class Event:
    """One event of a queue: ``queue`` (str), ``kind`` (one of ``KINDS``),
    ``job_id`` (str; None for ``paused``/``resumed``), ``id`` (the stream
    entry id, ``"<ms>-<seq>"``, and for the k-th of the events of an entry
    naming several jobs, a claim's ``active`` or retention's ``removed``,
    ``"<ms>-<seq>:<k>"``, k from 0: pass it as ``since`` to resume after
    the event), ``at_ms`` (ms since the epoch, when Redis wrote it) and
    ``fields`` (any other fields of the entry, str to str, e.g. a
    ``progress`` value). ``entry_id``: the stream entry's id alone.
    docs/howto/events.md#what-an-event-holds"""

    queue: str
    kind: str
    job_id: str | None
    id: str
    at_ms: int
    fields: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def ref(self) -> JobRef | None:
        """The job as a ``JobRef`` (None when the event names no job)."""
        return JobRef(self.queue, self.job_id) if self.job_id else None

    @property
    def entry_id(self) -> str:
        """The id of the stream entry that holds the event, ``"<ms>-<seq>"``."""
        return split_event_id(self.id)[0]


@dataclass(frozen=True)
class Gap:
    """The follower of ``queue`` fell behind the stream's cap (about 10,000
    entries): entries after ``id`` (the follower's position, str) and
    before ``oldest`` (the oldest entry the stream still holds) may have
    been trimmed unread. Yielded in place of an exception, before the
    events that follow it; ``kind`` is ``"gap"`` and ``job_id`` None, so a
    loop over ``kind`` needs no ``isinstance``.
    docs/howto/events.md#falling-behind"""

    queue: str
    id: str
    oldest: str
    kind: str = GAP
    job_id: None = None


def check_since(since: object) -> str:
    """``since`` if it is a stream id or an event's id (``STREAM_ID_RULE``);
    ``ValueError`` naming the rule otherwise."""
    if not isinstance(since, str) or not STREAM_ID.fullmatch(since):
        raise ValueError(f"invalid since {since!r}: {STREAM_ID_RULE}")
    if max(id_key(since)) >= 2**64:
        raise ValueError(f"invalid since {since!r}: {STREAM_ID_RULE}")
    return since


def check_follow(
    queues: str | Iterable[str],
    since: str | Mapping[str, str] | None,
    kinds: Iterable[str] | None,
    block_s: float | None,
) -> tuple[dict[str, str | None], frozenset[str] | None, float | None]:
    """``(positions, kinds, block_s)`` of a follow, or ``ValueError`` /
    ``TypeError`` naming the rule, before any Redis I/O.

    ``queues``: one queue name or several (at most ``MAX_FOLLOWED``, each
    ``keyspace.QUEUE_RULE``). ``since``: None (new events only), one stream
    id for every queue, or ``{queue: stream id}`` (queues it leaves out get
    new events only; a queue not followed is an error). ``kinds``: None
    (all) or names from ``KINDS``. ``block_s``: None (follow until closed)
    or a finite number of s >= 0 after which a follow with nothing new
    ends. ``positions`` maps each queue to its start id (None: new only).
    """
    if queues is None or not isinstance(queues, str | Iterable):
        raise TypeError(f"queues is one queue name or an iterable of names, got {queues!r}")
    names = [queues] if isinstance(queues, str) else list(queues)
    if not names:
        raise ValueError("no queues to follow: give one queue name or several")
    if len(names) > MAX_FOLLOWED:
        raise ValueError(f"{len(names)} queues: one follow reads at most {MAX_FOLLOWED}")
    for name in names:
        validate_queue(name)
    positions: dict[str, str | None] = dict.fromkeys(names)
    if isinstance(since, Mapping):
        for name, value in since.items():
            if name not in positions:
                raise ValueError(f"since names queue {name!r}, which is not followed")
            positions[name] = check_since(value)
    elif since is not None:
        positions = dict.fromkeys(names, check_since(since))
    wanted = None
    if kinds is not None:
        if isinstance(kinds, str):
            raise TypeError("kinds is a list of kind names, not one string")
        wanted = frozenset(kinds)
        if not wanted:
            raise ValueError("kinds is empty: give None for every kind, or some kind names")
        unknown = sorted(k for k in wanted if k not in KINDS)
        if unknown:
            raise ValueError(
                f"unknown event kind(s) {unknown}: kinds are {', '.join(sorted(KINDS))}"
            )
    if block_s is not None:
        ok = isinstance(block_s, int | float) and not isinstance(block_s, bool)
        if not ok or not math.isfinite(block_s) or block_s < 0:
            raise ValueError(f"invalid block_s {block_s!r}: a finite number of s >= 0, or None")
        block_s = float(block_s)
    return positions, wanted, block_s
