"""``mq.commands``: operator commands to running workers
(docs/howto/operate-workers.md; the keys in docs/explanation/protocol.md#worker-commands).

A command is ``shutdown`` (the SIGTERM path), ``drain`` (no more claims,
exit once the running jobs finish), ``pool-grow N`` or ``pool-shrink N``
(handlers). ``send`` checks everything before its first write (an unknown
worker id is refused, naming the live ones), then per worker:

* ``P:{q}:commands:<worker id>`` (zset, ``q`` the worker's first queue):
  the command as JSON, scored by when it was sent (ms). The worker's waker
  pops it with the same ``BZPOPMIN`` that waits for its queues' wake
  markers (``protocol/timers.Markers``): the key is on the slot of a queue
  it already blocks on, so an idle worker sends no extra command to hear
  one. Bounded: the newest ``PENDING_KEPT`` are kept, the key expires
  ``PENDING_TTL_MS`` after the last send, and a worker drops a command
  popped after that long (replied ``expired``): a worker that never reads
  leaves at most ``PENDING_KEPT`` members, for at most that long.
* ``P:command:<id>`` (stream, ``RECORD_TTL_S``): the record: ``sent`` (by
  the sender), then the worker's ``acknowledged`` and ``done`` (or
  ``expired``), each ``state``, ``detail``, ``at`` (ms). ``wait`` blocks on
  it (``XREAD BLOCK``), the admin page reads it.
* ``P:commands`` (zset): recent command ids, the newest ``RECENT_KEPT``.

No script: each write is one pipeline of plain commands; the pending key
and the record are never read together atomically.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from ..scripts import socket_timeout
from ..wire import Part

COMMANDS = ("shutdown", "drain", "pool-grow", "pool-shrink")
SIZED = ("pool-grow", "pool-shrink")  # the commands that take N (handlers)
PENDING_KEPT = 16  # commands a worker's pending key holds (the newest)
PENDING_TTL_MS = 600_000  # a command not popped within this long is dropped (ms)
RECORD_TTL_S = 3600  # how long a command's record (and its replies) is kept (s)
RECENT_KEPT = 100  # command ids P:commands keeps (the newest)
MAX_N = 10_000  # the largest N pool-grow / pool-shrink take (handlers)
NUDGE = "nudge"  # a member that only ends a worker's blocking read (``Markers.nudge``)
FINAL = ("done", "expired")  # the states after which a record takes no more replies


@dataclass(frozen=True)
class Command:
    """One command as a worker pops it: ``id``, ``name`` (one of
    ``COMMANDS``), ``n`` (handlers, for ``SIZED``; else None), ``sent_at``
    (ms)."""

    id: str
    name: str
    n: int | None
    sent_at: int


def check(name: str, n: int | None) -> None:
    """Raise ``ValueError`` naming the rule unless ``name`` is one of
    ``COMMANDS`` and ``n`` is a whole number 1-``MAX_N`` for ``pool-grow`` /
    ``pool-shrink`` and None for the others."""
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}: one of {', '.join(COMMANDS)}")
    if name in SIZED:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ValueError(f"{name} takes N, a whole number of handlers 1-{MAX_N}, got {n!r}")
    elif n is not None:
        raise ValueError(f"{name} takes no N, got {n!r}")


class WorkerCommands(Part):
    """The operator commands part of ``EchoMQ`` (``mq.commands``); it reads
    the live workers through ``presence`` (``mq.presence``). Every method
    raises ``RedisUnavailable`` when Redis cannot be reached."""

    def __init__(self, wire, presence) -> None:
        super().__init__(wire)
        self.presence = presence

    def pending_key(self, worker) -> str:
        """The key ``worker`` (a ``ProcessInfo``) pops its commands from."""
        return self.keys.queue(worker.queues[0]).commands(worker.id)

    def send(self, name: str, n: int | None = None, *, worker: str | None = None,
             all_workers: bool = False) -> list[tuple[str, str]]:  # fmt: skip
        """Send command ``name`` (``COMMANDS``; ``n`` handlers for
        ``pool-grow`` / ``pool-shrink``) to the live worker ``worker`` (its
        id, as the live-workers page and ``echomq_stats`` show it) or, with
        ``all_workers``, to every live worker. Returns ``[(command id,
        worker id)]``. Raises ``ValueError`` (nothing written) for a bad
        name or ``n``, neither or both of ``worker`` and ``all_workers``, an
        id that is no live worker's (the one-line error names the live
        ones), or ``all_workers`` with no worker running."""
        check(name, n)
        if (worker is None) == (not all_workers):
            raise ValueError("name one worker id, or all workers, not both or neither")
        live = [p for p in self.presence.live_processes() if p.kind == "worker" and p.queues]
        if all_workers:
            targets = live
            if not targets:
                raise ValueError("no worker is running")
        else:
            targets = [p for p in live if p.id == worker]
            if not targets:
                known = ", ".join(p.id for p in live) or "(none running)"
                raise ValueError(f"unknown worker id {worker!r}; live workers: {known}")
        now, sent = self.clock(), []
        # The records first, then the pending members, in two round trips: a
        # worker may pop its member and reply the moment it lands, and on a
        # Cluster one pipeline's writes to two nodes land in either order; a
        # record whose "sent" came after the replies would read as sent for good.
        records, pendings = (self.client.pipeline(transaction=False) for _ in range(2))
        for proc in targets:
            cid = f"{now}-{secrets.token_hex(4)}"
            member = json.dumps({"id": cid, "c": name, "n": n})
            pending, record = self.pending_key(proc), self.keys.command(cid)
            fields = {"state": "sent", "command": name, "n": "" if n is None else n,
                      "worker": proc.id, "at": now}  # fmt: skip
            records.xadd(record, fields)
            records.expire(record, RECORD_TTL_S)
            records.zadd(self.keys.command_index(), {cid: now})
            pendings.zadd(pending, {member: now})
            pendings.zremrangebyrank(pending, 0, -(PENDING_KEPT + 1))
            pendings.pexpire(pending, PENDING_TTL_MS)
            sent.append((cid, proc.id))
        records.zremrangebyrank(self.keys.command_index(), 0, -(RECENT_KEPT + 1))
        records.execute()
        pendings.execute()
        return sent

    @staticmethod
    def decode(member: str, score: int) -> Command | None:
        """The ``Command`` a worker popped (``member`` its JSON, ``score``
        when it was sent, ms); None for a ``NUDGE`` or a member that does
        not decode to a valid command."""
        try:
            d = json.loads(member)
            check(d["c"], d["n"])
            return Command(str(d["id"]), d["c"], d["n"], int(score))
        except (TypeError, ValueError, KeyError):
            return None

    def expired(self, command: Command) -> bool:
        """True when ``command`` was popped ``PENDING_TTL_MS`` or more after
        it was sent: the worker drops it."""
        return self.clock() - command.sent_at >= PENDING_TTL_MS

    def reply(self, command_id: str, *replies: tuple[str, str]) -> None:
        """Append ``(state, detail)`` replies to a command's record
        (``acknowledged``, ``done``, ``expired``), one round trip."""
        record, now = self.keys.command(command_id), self.clock()
        pipe = self.client.pipeline(transaction=False)
        for state, detail in replies:
            pipe.xadd(record, {"state": state, "detail": detail, "at": now})
        pipe.expire(record, RECORD_TTL_S)
        pipe.execute()

    def record(self, command_id: str) -> dict | None:
        """A command's record: ``{id, command, n, worker, sent_at, state,
        detail, at}`` (state and detail the latest reply's, ``at`` its ms);
        None when it is unknown or expired. Read-only."""
        return _fold(command_id, self.client.xrange(self.keys.command(command_id)))

    def recent(self, limit: int = 20) -> list[dict]:
        """The records of the ``limit`` most recent commands (newest first;
        see ``record``), those still kept. Read-only, one round trip for the
        ids and one for the records."""
        ids = [_text(i) for i in self.client.zrevrange(self.keys.command_index(), 0, limit - 1)]
        pipe = self.client.pipeline(transaction=False)
        for cid in ids:
            pipe.xrange(self.keys.command(cid))
        rows = [_fold(cid, entries) for cid, entries in zip(ids, pipe.execute(), strict=True)]
        return [row for row in rows if row is not None]

    def wait(self, command_id: str, timeout_s: float, until=FINAL) -> dict | None:
        """Block up to ``timeout_s`` seconds (``XREAD BLOCK``, no polling)
        until a command's record reaches one of the states ``until``;
        returns the record as then (``record``), None when it is unknown."""
        key = self.keys.command(command_id)
        entries = self.client.xrange(key)
        deadline = self.clock() + int(timeout_s * 1000)
        cut = socket_timeout(self.client)  # each block ends before the client's socket timeout
        block_max = int(cut * 500) if cut else None  # ms: half of it
        while entries:
            row = _fold(command_id, entries)
            left = deadline - self.clock()
            if row["state"] in until or left <= 0:
                return row
            last = _text(entries[-1][0])
            block = max(1, left if block_max is None else min(left, block_max))
            got = self.client.xread({key: last}, block=block)
            if got:
                entries = entries + list(got[0][1])
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fold(command_id: str, entries) -> dict | None:
    """A record's entries folded into one row (``WorkerCommands.record``)."""
    if not entries:
        return None
    rows = [{_text(k): _text(v) for k, v in fields.items()} for _, fields in entries]
    first, last = rows[0], rows[-1]
    n = first.get("n", "")
    return {
        "id": command_id,
        "command": first.get("command", ""),
        "n": int(n) if n else None,
        "worker": first.get("worker", ""),
        "sent_at": int(first.get("at", 0)),
        "state": last.get("state", ""),
        "detail": last.get("detail", ""),
        "at": int(last.get("at", 0)),
    }
