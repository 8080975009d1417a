"""``mq.events``: follow the queues' events streams (``P:{q}:events``) as
they grow, blocking on ``XREAD BLOCK``
(docs/explanation/protocol.md#following-the-events).

At most once, nothing acknowledged, nothing written: any number of
followers read the same streams, each from its own position. No script of
its own; the transitions' scripts write the streams (``lua/lib/emit.lua``).

One ``XREAD`` may name several streams only on one Cluster slot, and each
queue's keys sit on their own slot. A follow of queues on one slot (or on a
single server) blocks in the caller's thread; one over several slots runs
one reader thread per slot, each blocking on its own ``XREAD``, into a
bounded in-process queue the caller takes from. Threads, not a round-robin
of short blocks: a round-robin answers an event up to one block late per
other slot, and short blocks are polling by another name.
"""

from __future__ import annotations

import asyncio
import json
import queue as queues_
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping

from redis.cluster import RedisCluster
from redis.crc import key_slot

from ...core.events import Event, Gap, check_follow, event_id, id_key, run_ids, split_event_id
from ...core.jobs import to_text
from ..errors import translating
from ..scripts import socket_timeout
from ..wire import Part
from .blocking import off_loop

READ_COUNT = 500  # entries one XREAD takes per stream
INBOX_MAX = 1_000  # items the reader threads hold for a slow caller, at most
SLICE_S = 5.0  # one XREAD BLOCK lasts at most this (s): a closed follow's threads end by then
SOCKET_MARGIN_S = 1.0  # each block ends this much before the client's socket timeout (s)


def _entries(reply) -> list[tuple[str, list]]:
    """``[(stream key, entries)]`` of an XREAD reply, RESP2 (a list) or RESP3 (a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(to_text(k), v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [(to_text(k), v) for k, v in reply]


def _decode(queue: str, eid, raw: Mapping) -> list[Event]:
    """One stream entry as its events: one per job id its ``id`` field names
    (space-separated when several, later ones maybe relative to the first:
    ``run_ids``), or one with ``job_id`` None. A batched
    ``progress`` entry (``ps``, a JSON array of values, one per id) gives
    each event its own value as ``p``, as a single one carries it."""
    eid = to_text(eid)
    fields = {to_text(k): to_text(v) for k, v in raw.items()}
    kind, ids = fields.pop("e", ""), fields.pop("id", "")
    at_ms = id_key(eid)[0]
    if not ids:
        return [Event(queue, kind, None, eid, at_ms, fields)]
    jobs = run_ids(ids)
    n = len(jobs)  # each event its own id: "<entry id>:<k>" when there are several
    if "ps" in fields:
        values = split_values(fields.pop("ps"))
        return [
            Event(queue, kind, job_id, event_id(eid, k, n), at_ms, {**fields, "p": value})
            for k, (job_id, value) in enumerate(zip(jobs, values, strict=True))
        ]
    return [Event(queue, kind, job_id, event_id(eid, k, n), at_ms, fields)
            for k, job_id in enumerate(jobs)]  # fmt: skip


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id`` ("<ms>-<seq>"): an XREAD after
    it reads that entry again."""
    ms, seq = id_key(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms else "0-0"


_SCAN = json.JSONDecoder().raw_decode
_SPACE = re.compile(r"[ \t\n\r]*")


def split_values(text: str) -> list[str]:
    """The elements of the JSON array ``text`` as their own JSON texts, as
    written (not decoded and encoded again; white space around each
    dropped). Raises ``ValueError`` for text that is not a JSON array."""
    out: list[str] = []
    at = _SPACE.match(text).end()
    if text[at : at + 1] != "[":
        raise ValueError(f"not a JSON array: {text[:40]!r}")
    at = _SPACE.match(text, at + 1).end()
    while text[at : at + 1] != "]":
        _, stop = _SCAN(text, at)
        out.append(text[at:stop])
        at = _SPACE.match(text, stop).end()
        if text[at : at + 1] == ",":
            at = _SPACE.match(text, at + 1).end()
        elif text[at : at + 1] != "]":
            raise ValueError(f"not a JSON array: {text[:40]!r}")
    return out


class Follow:
    """An iterator, and an async iterator, over the events of some queues;
    made by ``mq.events(...)`` (``Events.__call__``), which validates its
    arguments. Yields ``Event`` and ``Gap`` (``core/events.py``) in stream
    order per queue. ``next()`` waits at most ``block_s`` s for the next one
    (None: until there is one) and the iteration ends when it waited that
    long for nothing; iterating again carries on from there (a view sends a
    keep-alive between two). ``position`` is ``{queue: id of the last event yielded}``:
    pass it as ``since`` to resume. ``close()`` (or ``with``) ends it and
    its reader threads (within ``SLICE_S`` s). Raises ``RedisUnavailable``
    / ``RedisCommandError`` from a read. docs/howto/events.md"""

    def __init__(self, part: Part, positions: dict, kinds, block_s: float | None) -> None:
        self.client = part.client
        self.kinds, self.block_s = kinds, block_s
        self._key = {q: part.keys.queue(q).events for q in positions}
        self._queue_of = {key: q for q, key in self._key.items()}
        self._read_at: dict[str, str | None] = dict(positions)
        self._start: dict[str, str | None] = dict(positions)
        # queue -> (entry id, k): resuming after the k-th event of an entry reads the entry
        # again and drops its events up to the k-th
        self._skip: dict[str, tuple[str, int]] = {}
        for q, at in positions.items():
            entry, k = split_event_id(at) if at is not None else (None, None)
            if k is not None:
                self._read_at[q], self._skip[q] = _before(entry), (entry, k)
        self._position: dict[str, str] = {}
        self._buf: deque = deque()
        self._stop = threading.Event()
        self._cancel = threading.Event()  # the async step's read: set when the step is cancelled
        self._filling: asyncio.Future | None = None  # that read, while it runs
        self._inbox: queues_.Queue = queues_.Queue(INBOX_MAX)
        self._threads: list[threading.Thread] = []
        slots: dict[int, list[str]] = {}
        for q, key in self._key.items():
            slot = key_slot(key.encode()) if isinstance(self.client, RedisCluster) else 0
            slots.setdefault(slot, []).append(q)
        self._groups = list(slots.values())
        cut = socket_timeout(self.client)
        self._slice = SLICE_S
        if cut:
            self._slice = min(
                SLICE_S, cut - SOCKET_MARGIN_S if cut > 2 * SOCKET_MARGIN_S else cut / 2
            )

    @property
    def position(self) -> dict[str, str]:
        """``{queue: event id}``: per queue the last event yielded (``Event.id``), else
        where the follow started (a queue followed from "now" is left out
        until ``start()`` or the first step fixed it). ``since=position``
        resumes right after what was yielded."""
        started = {q: at for q, at in self._start.items() if at is not None}
        return {**started, **self._position}

    def start(self) -> Follow:
        """Fix "now" for the queues followed without ``since`` (their
        streams' newest ids, one pipelined read) and return the follow. The
        first step does it when not called: call it to count from now
        rather than from the first ``next()``. Raises ``RedisUnavailable``."""
        self._start_ids()
        return self

    @translating
    def _start_ids(self) -> None:
        """Each queue followed from "now": its stream's newest id, so no
        entry between two blocking reads is missed ('0-0' for no stream)."""
        new = [q for q, at in self._read_at.items() if at is None]
        if not new:
            return
        pipe = self.client.pipeline(transaction=False)
        for q in new:
            pipe.xrevrange(self._key[q], "+", "-", count=1)
        for q, last in zip(new, pipe.execute(), strict=True):
            self._read_at[q] = self._start[q] = to_text(last[0][0]) if last else "0-0"

    @translating
    def _read(self, group: list[str], block_ms: int | None) -> list:
        """One XREAD over ``group`` (queues on one slot), blocking up to
        ``block_ms`` ms (None: not at all); the wanted events and any ``Gap``."""
        streams = {self._key[q]: self._read_at[q] for q in group}
        reply = self.client.xread(streams, count=READ_COUNT, block=block_ms)
        out: list = []
        for key, entries in _entries(reply):
            if not entries:
                continue
            q = self._queue_of[key]
            last = self._read_at[q]
            if len(entries) >= READ_COUNT and id_key(last) > (0, 0):
                info = self.client.xinfo_stream(key)
                first = info.get("first-entry")
                oldest = to_text(first[0]) if first else to_text(entries[0][0])
                trimmed = int(info.get("entries-added", 0) or 0) > int(info.get("length", 0))
                if trimmed and id_key(oldest) > id_key(last):
                    out.append(Gap(q, last, oldest))
            for eid, raw in entries:
                events = _decode(q, eid, raw)
                if q in self._skip:  # the first read after an event's id
                    entry, k = self._skip.pop(q)
                    if to_text(eid) == entry:
                        events = events[k + 1 :]
                out.extend(e for e in events if not self.kinds or e.kind in self.kinds)
            self._read_at[q] = to_text(entries[-1][0])
        return out

    def _reader(self, group: list[str]) -> None:
        """A reader thread: one slot's XREAD BLOCK in a loop, into the inbox."""
        while not self._stop.is_set():
            try:
                items = self._read(group, max(1, int(self._slice * 1000)))
            except Exception as err:  # handed to the caller, unless it closed the follow
                if self._stop.is_set():
                    return  # its client may be closed under the block: nothing to say
                items = [err]
            for item in items:
                while not self._stop.is_set():
                    try:
                        self._inbox.put(item, timeout=self._slice)
                        break
                    except queues_.Full:
                        continue  # the caller is slow: this slot waits (bounded)
            if items and isinstance(items[-1], Exception):
                return

    def _take(self, wait_s: float | None) -> bool:
        """Fill the buffer, waiting at most ``wait_s`` s; False when nothing came."""
        if len(self._groups) == 1:
            if wait_s == 0:
                self._buf.extend(self._read(self._groups[0], None))
                return bool(self._buf)
            block = self._slice if wait_s is None else min(wait_s, self._slice)
            self._buf.extend(self._read(self._groups[0], max(1, int(block * 1000))))
            return bool(self._buf)
        if not self._threads:
            for group in self._groups:
                thread = threading.Thread(target=self._reader, args=(group,), daemon=True)
                thread.name = f"echomq-events-{group[0]}"
                self._threads.append(thread)
                thread.start()
        try:
            item = self._inbox.get(
                timeout=self._slice if wait_s is None else min(wait_s, self._slice)
            )
        except queues_.Empty:
            return False
        if isinstance(item, Exception):
            raise item
        self._buf.append(item)
        return True

    def __iter__(self) -> Follow:
        return self

    def _fill(self, cancel: threading.Event | None) -> bool:
        """Read until the buffer holds something, ``block_s`` passed (then
        True), or the follow is closed or ``cancel`` set (False). Each read
        blocks one slice at most, so a close ends it within ``SLICE_S`` s."""
        if any(at is None for at in self._read_at.values()):
            self._start_ids()
        deadline = None if self.block_s is None else time.monotonic() + self.block_s
        while not self._buf:
            if self._stop.is_set() or (cancel is not None and cancel.is_set()):
                return False
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._take(left) and deadline is not None and time.monotonic() >= deadline:
                return True
        return False

    def _pop(self) -> Event | Gap:
        item = self._buf.popleft()
        if not isinstance(item, Gap):
            self._position[item.queue] = item.id
        return item

    def __next__(self) -> Event | Gap:
        if not self._stop.is_set() and not self._buf:
            self._fill(None)
        if self._stop.is_set() or not self._buf:
            raise StopIteration  # closed, or block_s passed with nothing
        return self._pop()

    def __aiter__(self) -> Follow:
        return self

    async def __anext__(self) -> Event | Gap:
        """The next event; a read blocks on a thread of its own
        (``blocking.off_loop``), never on the event loop nor its shared
        executor. A cancelled ``await`` ends that read within ``SLICE_S`` s,
        and whatever it read stays for the next step."""
        while self._stop.is_set() or not self._buf:
            if self._stop.is_set():
                raise StopAsyncIteration
            if self._filling is None or self._filling.done():
                # one read at a time: a cancelled step's read ends first
                self._cancel = threading.Event()
                self._filling = asyncio.ensure_future(
                    off_loop(self._fill, self._cancel, name="echomq-events")
                )
            try:
                ended = await asyncio.shield(self._filling)
            except asyncio.CancelledError:
                self._cancel.set()
                raise
            if ended and not self._buf:
                raise StopAsyncIteration
        return self._pop()

    def close(self) -> None:
        """End the follow: ``next()`` stops, its read and the reader threads
        end within ``SLICE_S`` s."""
        self._stop.set()

    async def aclose(self) -> None:
        """``close()`` for ``async with`` and async generators' habits."""
        self.close()

    def __enter__(self) -> Follow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> Follow:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class Events(Part):
    """Following the queues' events (``mq.events``): the part is called."""

    def __call__(
        self,
        queues: str | Iterable[str],
        since: str | Mapping[str, str] | None = None,
        kinds: Iterable[str] | None = None,
        block_s: float | None = None,
    ) -> Follow:
        """A ``Follow`` over the events of ``queues`` (one name or several,
        at most 64): an iterator and an async iterator of ``Event`` / ``Gap``.

        ``since``: None (only what happens from now), a stream id
        (``"<ms>-<seq>"``: after that entry) or an ``Event.id`` (after that
        event, ``"<ms>-<seq>:<k>"`` for one of an entry's several) for every
        queue, or ``{queue: id}`` (``Follow.position``); the follow starts after it, with
        what the stream still holds. ``kinds``: None (all) or kind names
        (``core.events.KINDS``). ``block_s``: each step waits at most this
        many s for an event and the follow ends when one waited in vain;
        None follows until closed. Raises ``ValueError`` (``TypeError`` for
        a string as ``kinds``) naming the rule for a bad queue name, since,
        kind or block_s, before any Redis I/O; reads raise
        ``RedisUnavailable``. docs/howto/events.md"""
        positions, wanted, block_s = check_follow(queues, since, kinds, block_s)
        return Follow(self, positions, wanted, block_s)
