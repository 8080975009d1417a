"""Presence (docs/explanation/house.md, "protocol/"): which workers and pumps are
running, and which queues exist. This module runs no script.

**Live processes.** Every worker and pump registers itself with a heartbeat
(``runners/heartbeat.py`` beats): ``P:process:<id>`` holds its description
as JSON with a TTL, and the zset ``P:processes`` maps its id to the ms time
that registration expires (its last heartbeat plus ``MISSED_BEATS``
heartbeat intervals). A process that stops cleanly removes both at once; one
that dies (SIGKILL included) drops out of every listing ``MISSED_BEATS``
intervals after its last beat, and its key expires in Redis at the same
time. A process's first beat, and every ``UPKEEP_EVERY``-th after it, also
trims the index: expired ids go, and at most ``MAX_PROCESSES`` are kept
(between two upkeeps a process only re-adds its own id). Everything is
under the configured prefix, so a process of another prefix never shows up.

**Every queue ever used.** ``P:queues`` is a set of the queues that have had
a job: ``Wire.note_queues`` adds a queue before the first write to it
(``enqueue``, ``add_flow``), once a minute at most per process, up to
``wire.MAX_QUEUES`` names. The set lives on no queue's Cluster slot, so no
Lua script can add to it atomically with the job it writes (on a Cluster a
script may only touch keys of one slot); the host adds the name before it
writes the job, so a queue with a job is always in the set.

**Since when no worker served a queue.** ``P:served`` maps a queue to the
ms time since which no worker may have served it: each worker's upkeep
beat (its first, then one every ``UPKEEP_EVERY``) sets its queues to now;
``Wire.register_queues`` sets a queue's first use (HSETNX). So a queue no
worker serves reads "no worker for N s", N counted from its last worker's
last upkeep (at most ``UPKEEP_EVERY`` heartbeats before it stopped) or its
first job (``no_worker_since``). The
hash holds at most ``MAX_SERVED`` queues: a beat that finds it over starts
it afresh with its own queues (the others then read "unknown").

``Presence`` is the part ``mq.presence``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from ..core.keyspace import validate_queue
from .errors import reports_redis_down
from .wire import Part

MISSED_BEATS = 3  # a process leaves the list this many heartbeats after its last one
MAX_PROCESSES = 1000  # ids the index keeps (the newest expiries) and a listing returns
MAX_SERVED = 10_000  # queues P:served holds; past it a beat starts it afresh
UPKEEP_EVERY = 4  # a runner's beats per index trim and P:served write (a minute at 15 s)
KINDS = ("worker", "pump")


@dataclass
class ProcessInfo:
    """One live worker or pump as its last heartbeat described it.

    ``kind``: ``worker`` or ``pump``; ``queues``: the queues it serves;
    ``started_at`` / ``heartbeat_at`` / ``expires_at``: ms since the epoch;
    ``jobs_done``: jobs it finished (completed, failed or dead) since it
    started; ``running``: jobs it holds now, ``running_jobs`` the first
    ``RUNNING_SHOWN`` of them as ``queue/id``; ``concurrency``: handler
    threads (workers; 0 for a pump); ``version``: echomq-django's.
    """

    id: str
    kind: str
    host: str
    pid: int
    queues: list[str]
    started_at: int
    heartbeat_at: int
    expires_at: int
    prefix: str
    jobs_done: int = 0
    running: int = 0
    running_jobs: list[str] = field(default_factory=list)
    concurrency: int = 0
    version: str = ""

    def as_dict(self) -> dict:
        """The JSON shape (``echomq_stats --json``'s ``processes`` entries)."""
        return asdict(self)


_FIELDS = {f.name for f in fields(ProcessInfo)}


def _decode(raw, prefix: str) -> ProcessInfo | None:
    """A ``ProcessInfo`` from a heartbeat's JSON, or None for one that does
    not decode or belongs to another prefix."""
    try:
        d = json.loads(raw)
        info = ProcessInfo(**{k: v for k, v in d.items() if k in _FIELDS})
    except (TypeError, ValueError, AttributeError):
        return None
    if info.prefix != prefix or info.kind not in KINDS:
        return None
    return info


class Presence(Part):
    """The presence part of ``EchoMQ`` (``mq.presence``). Every method raises
    ``RedisUnavailable`` when Redis cannot be reached."""

    @reports_redis_down
    def beat(self, info: ProcessInfo, interval_s: float, upkeep: bool = True) -> None:
        """Write one heartbeat of ``info`` (its ``heartbeat_at`` /
        ``expires_at`` set here from the clock): the JSON key with a TTL of
        ``MISSED_BEATS`` intervals of ``interval_s`` (s) and its id in the
        index, two commands. With ``upkeep`` also the index trimmed and the
        worker's queues marked served in ``P:served`` (four more): a runner
        asks for it on its first beat and then every ``UPKEEP_EVERY``
        beats, so its idle cost stays low while both stay bounded (a beat
        only re-adds its own id). One round trip on a single
        server."""
        ttl_ms = max(1, int(interval_s * 1000 * MISSED_BEATS))
        now = self.clock()
        info.heartbeat_at, info.expires_at = now, now + ttl_ms
        index = self.keys.processes()
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.process(info.id), json.dumps(info.as_dict()), px=ttl_ms)
        pipe.zadd(index, {info.id: info.expires_at})
        if not upkeep:
            pipe.execute()
            return
        pipe.zremrangebyscore(index, "-inf", now)
        pipe.zremrangebyrank(index, 0, -(MAX_PROCESSES + 1))
        served = self.keys.served()
        if info.kind == "worker" and info.queues:
            pipe.hset(served, mapping=dict.fromkeys(info.queues, now))
        pipe.hlen(served)
        if pipe.execute()[-1] > MAX_SERVED:  # bounded: start afresh with the live ones
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(served)
            if info.kind == "worker" and info.queues:
                pipe.hset(served, mapping=dict.fromkeys(info.queues, now))
            pipe.execute()

    @reports_redis_down
    def leave(self, process_id: str, queues=()) -> None:
        """Remove a process from the list at once (a clean stop); ``queues``
        (names) are the ones it served until now: ``P:served`` says so, as
        the upkeep of its last beat may not have."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.keys.processes(), process_id)
        pipe.delete(self.keys.process(process_id))
        if queues:
            pipe.hset(self.keys.served(), mapping=dict.fromkeys(queues, self.clock()))
        pipe.execute()

    @reports_redis_down
    def live_processes(self, now_ms: int | None = None) -> list[ProcessInfo]:
        """The workers and pumps whose registration has not expired at
        ``now_ms`` (default: the clock), at most ``MAX_PROCESSES``, sorted by
        kind, host and pid. Read-only."""
        now = self.clock() if now_ms is None else now_ms
        ids = self.client.zrangebyscore(self.keys.processes(), f"({now}", "+inf", 0, MAX_PROCESSES)
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.get(self.keys.process(pid.decode() if isinstance(pid, bytes) else pid))
        out = []
        for raw in pipe.execute():
            info = _decode(raw, self.keys.prefix) if raw is not None else None
            if info is not None and info.expires_at > now:
                out.append(info)
        return sorted(out, key=lambda p: (p.kind, p.host, p.pid, p.id))

    @reports_redis_down
    def no_worker_since(self, queues) -> dict[str, int | None]:
        """``{queue: ms}`` from ``P:served`` for each of ``queues``: the last
        heartbeat of a worker serving it, or its first use; None when
        unknown (used before this was recorded, or the hash started
        afresh). One HMGET. Read-only."""
        names = list(queues)
        if not names:
            return {}
        raw = self.client.hmget(self.keys.served(), names)
        return {q: None if v is None else int(v) for q, v in zip(names, raw, strict=True)}

    @reports_redis_down
    def queues(self) -> list[str]:
        """The names in ``P:queues`` (valid queue names only), sorted."""
        out = []
        for raw in self.client.smembers(self.keys.queues()):
            name = raw.decode() if isinstance(raw, bytes) else raw
            try:
                out.append(validate_queue(name))
            except ValueError:
                continue
        return sorted(out)

    def register_queues(self, queues) -> list[str]:
        """Add ``queues`` to ``P:queues`` (``Wire.register_queues``)."""
        return self.wire.register_queues(queues)
