"""Who is running, and which queues exist (DESIGN §10.5).

**Live processes.** Every worker and pump registers itself with a heartbeat:
``P:process:<id>`` holds its description as JSON with a TTL, and the zset
``P:processes`` maps its id to the ms time that registration expires
(its last heartbeat plus ``MISSED_BEATS`` heartbeat intervals). A process
that stops cleanly removes both at once; one that dies (SIGKILL included)
drops out of every listing ``MISSED_BEATS`` intervals after its last beat,
and its key expires in Redis at the same time. Every beat also trims the
index: expired ids go, and at most ``MAX_PROCESSES`` are kept. Everything is
under the configured prefix, so a process of another prefix never shows up.

**Every queue ever used.** ``P:queues`` is a set of the queues that have had
a job: ``EchoMQ.note_queues`` adds a queue before the first write to it
(``enqueue``, ``add_flow``), once a minute at most per process, up to
``client.MAX_QUEUES`` names. The set lives on no queue's Cluster slot, so no
Lua script can add to it atomically with the job it writes (on a Cluster a
script may only touch keys of one slot); the host adds the name before it
writes the job, so a queue with a job is always in the set. This module
reads it (``redis_queues``, ``known_queues``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata

import redis

from ..conf import config
from ..core.keyspace import validate_queue

log = logging.getLogger("echomq_django.registry")

HEARTBEAT_S = 5.0  # seconds between a process's heartbeats
MISSED_BEATS = 3  # a process leaves the list this many heartbeats after its last one
MAX_PROCESSES = 1000  # ids the index keeps (the newest expiries) and a listing returns
RUNNING_SHOWN = 20  # running job refs a heartbeat carries (the count is exact)
KINDS = ("worker", "pump")


def package_version() -> str:
    """The installed echomq-django version ('unknown' from a bare checkout)."""
    try:
        return metadata.version("echomq-django")
    except metadata.PackageNotFoundError:
        return "unknown"


def new_process_id() -> str:
    """``host:pid:hex``: unique per process start, readable in a listing."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


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


def beat(mq, info: ProcessInfo, interval_s: float) -> None:
    """Write one heartbeat of ``info`` (its ``heartbeat_at`` / ``expires_at``
    set here from ``mq.clock()``): the JSON key with a TTL of ``MISSED_BEATS``
    intervals, its id in the index, and the index trimmed. One round trip
    on a single server. Raises redis-py errors."""
    ttl_ms = max(1, int(interval_s * 1000 * MISSED_BEATS))
    now = mq.clock()
    info.heartbeat_at, info.expires_at = now, now + ttl_ms
    index = mq.keys.processes()
    pipe = mq.client.pipeline(transaction=False)
    pipe.set(mq.keys.process(info.id), json.dumps(info.as_dict()), px=ttl_ms)
    pipe.zadd(index, {info.id: info.expires_at})
    pipe.zremrangebyscore(index, "-inf", now)
    pipe.zremrangebyrank(index, 0, -(MAX_PROCESSES + 1))
    pipe.execute()


def leave(mq, process_id: str) -> None:
    """Remove a process from the list at once (a clean stop)."""
    pipe = mq.client.pipeline(transaction=False)
    pipe.zrem(mq.keys.processes(), process_id)
    pipe.delete(mq.keys.process(process_id))
    pipe.execute()


def live_processes(mq, now_ms: int | None = None) -> list[ProcessInfo]:
    """The workers and pumps whose registration has not expired at
    ``now_ms`` (default ``mq.clock()``), at most ``MAX_PROCESSES``, sorted by
    kind, host and pid. Read-only. Raises redis-py errors."""
    now = mq.clock() if now_ms is None else now_ms
    ids = mq.client.zrangebyscore(mq.keys.processes(), f"({now}", "+inf", 0, MAX_PROCESSES)
    if not ids:
        return []
    pipe = mq.client.pipeline(transaction=False)
    for pid in ids:
        pipe.get(mq.keys.process(pid.decode() if isinstance(pid, bytes) else pid))
    out = []
    for raw in pipe.execute():
        info = _decode(raw, mq.keys.prefix) if raw is not None else None
        if info is not None and info.expires_at > now:
            out.append(info)
    return sorted(out, key=lambda p: (p.kind, p.host, p.pid, p.id))


class Heartbeat:
    """Keeps one process registered while it runs (DESIGN §10.5).

    ``mq``: an ``EchoMQ``; ``kind``: ``worker`` or ``pump``; ``queues``: the
    queue names it serves; ``interval_s`` (s, > 0): time between beats;
    ``status``: a callable returning ``{jobs_done, running, running_jobs}``
    at each beat (None: zeros); ``concurrency``: handler threads.
    ``start()`` beats once at once (a Redis error is logged at DEBUG, not
    raised: the runner reports outages; the process runs without being
    listed until Redis answers), then every
    ``interval_s`` on a daemon thread; ``stop()`` ends the thread and
    removes the registration. Raises ``ValueError`` for a bad kind, queue
    name or interval.
    """

    def __init__(
        self, mq, kind: str, queues, interval_s: float = HEARTBEAT_S, status=None, concurrency=0
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 (seconds), got {interval_s!r}")
        self.mq, self.interval_s, self.status = mq, float(interval_s), status
        now = mq.clock()
        self.info = ProcessInfo(
            id=new_process_id(),
            kind=kind,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=[validate_queue(q) for q in queues],
            started_at=now,
            heartbeat_at=now,
            expires_at=now,
            prefix=mq.keys.prefix,
            concurrency=int(concurrency),
            version=package_version(),
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def beat(self) -> bool:
        """Write one heartbeat now; False (logged at DEBUG once per outage)
        when Redis could not be reached."""
        if self.status is not None:
            s = self.status()
            self.info.jobs_done = int(s.get("jobs_done", 0))
            self.info.running = int(s.get("running", 0))
            self.info.running_jobs = list(s.get("running_jobs", ()))[:RUNNING_SHOWN]
        try:
            beat(self.mq, self.info, self.interval_s)
        except redis.RedisError as err:
            if not self._failing:  # the runner reports the outage itself
                log.debug("heartbeat of %s %s failed: %s", self.info.kind, self.info.id, err)
            self._failing = True
            return False
        self._failing = False
        return True

    def start(self) -> Heartbeat:
        self.beat()
        self._thread = threading.Thread(
            target=self._run, name=f"echomq-{self.info.kind}-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            leave(self.mq, self.info.id)
        except redis.RedisError as err:  # it leaves the list when its key expires
            log.debug("could not remove %s %s from the list: %s", self.info.kind, self.info.id, err)


def announce(
    mq,
    kind: str,
    queues,
    *,
    register: bool = True,
    beat_s: float = HEARTBEAT_S,
    status=None,
    concurrency: int = 0,
    warn: logging.Logger | None = None,
) -> Heartbeat | None:
    """What a runner does as it starts (DESIGN §10.5): with ``warn`` (a
    logger), warn about queues known nowhere (``unknown_queue_warning``;
    skipped while Redis is down: the runner reports that); then, unless
    ``register`` is off, start the ``Heartbeat`` that lists it (returned:
    ``stop()`` it when the runner returns)."""
    if warn is not None:
        try:
            warning = unknown_queue_warning(mq, queues)
        except (redis.RedisError, ConnectionError):
            warning = None
        if warning:
            warn.warning("%s", warning)
    if not register:
        return None
    return Heartbeat(mq, kind, queues, beat_s, status=status, concurrency=concurrency).start()


# -- every queue ever used ----------------------------------------------------
def redis_queues(mq) -> list[str]:
    """The names in ``P:queues`` (valid queue names only), sorted."""
    out = []
    for raw in mq.client.smembers(mq.keys.queues()):
        name = raw.decode() if isinstance(raw, bytes) else raw
        try:
            out.append(validate_queue(name))
        except ValueError:
            continue
    return sorted(out)


def settings_queues() -> list[str]:
    """The queue names of ``ECHOMQ["QUEUES"]`` (valid ones), sorted."""
    out = []
    for name in config().get("QUEUES", {}) or {}:
        try:
            out.append(validate_queue(name))
        except ValueError:
            continue
    return sorted(out)


def known_queues(mq, extra=()) -> list[str]:
    """Every queue known anywhere: ``P:queues``, ``ECHOMQ["QUEUES"]``, the
    queues live processes serve, and ``extra``; sorted, without repeats."""
    names = set(redis_queues(mq)) | set(settings_queues()) | set(extra)
    for proc in live_processes(mq):
        names.update(proc.queues)
    return sorted(names)


def unknown_queue_warning(mq, queues) -> str | None:
    """The warning a worker logs when it starts on queues that no job or
    setting has used: names them and the known ones; None when every queue
    is known, or when nothing is known at all (a fresh Redis and no
    ``ECHOMQ["QUEUES"]``: workers often start before the first job). Raises
    redis-py errors."""
    known = set(redis_queues(mq)) | set(settings_queues())
    unknown = [q for q in queues if q not in known]
    if not unknown or not known:  # nothing known yet: a fresh site starts its workers first
        return None
    shown = ", ".join(sorted(known)[:50]) or "(none)"
    return (
        f"queue{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
        f"{'are' if len(unknown) > 1 else 'is'} not known: no job was ever added to "
        f"{'them' if len(unknown) > 1 else 'it'} and ECHOMQ['QUEUES'] does not name "
        f"{'them' if len(unknown) > 1 else 'it'}; known queues: {shown}. A typo?"
    )
