"""A runner's heartbeat, and the queues it can know of (docs/explanation/house.md,
"runners/").

``Heartbeat`` keeps one worker or pump listed while it runs: it beats every
``interval_s`` through ``mq.presence`` (``protocol/presence.py`` says what a
beat writes and when a process drops out of the list) and leaves the list
when it stops. ``announce`` is what a runner does as it starts. The known
queues are those of ``P:queues``, of ``ECHOMQ["QUEUES"]`` and of the live
processes (``known_queues``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from importlib import metadata

from ..conf import config
from ..core.exceptions import EchoMQError
from ..core.keyspace import validate_queue
from ..protocol.presence import KINDS, UPKEEP_EVERY, ProcessInfo

log = logging.getLogger("echomq_django.heartbeat")

# seconds between a process's heartbeats: a process that died leaves the list
# MISSED_BEATS of them after its last (45 s); nothing recovers work by it (leases do)
HEARTBEAT_S = 15.0
RUNNING_SHOWN = 20  # running job refs a heartbeat carries (the count is exact)


def package_version() -> str:
    """The installed echomq-django version ('unknown' from a bare checkout)."""
    try:
        return metadata.version("echomq-django")
    except metadata.PackageNotFoundError:
        return "unknown"


def new_process_id() -> str:
    """``host:pid:hex``: unique per process start, readable in a listing."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Heartbeat:
    """Keeps one process registered while it runs (docs/explanation/house.md#monitoring).

    ``mq``: an ``EchoMQ``; ``kind``: ``worker`` or ``pump``; ``queues``: the
    queue names it serves; ``interval_s`` (s, > 0): time between beats;
    ``status``: a callable returning ``{jobs_done, running, running_jobs}``
    at each beat (None: zeros), and ``concurrency`` when it changes;
    ``concurrency``: handlers at the start; ``process_id``: its id (None:
    a new ``new_process_id()``).
    ``start()`` beats once at once (a Redis error is logged at DEBUG, not
    raised: the runner reports outages; the process runs without being
    listed until Redis answers), then every
    ``interval_s`` on a daemon thread; ``stop()`` ends the thread and
    removes the registration. Raises ``ValueError`` for a bad kind, queue
    name or interval.
    """

    def __init__(
        self,
        mq,
        kind: str,
        queues,
        interval_s: float = HEARTBEAT_S,
        status=None,
        concurrency=0,
        process_id: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 (seconds), got {interval_s!r}")
        self.mq, self.interval_s, self.status = mq, float(interval_s), status
        now = mq.clock()
        self.info = ProcessInfo(
            id=process_id or new_process_id(),
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
        self.beats = 0  # beats written

    def beat(self) -> bool:
        """Write one heartbeat now (its first, the first after an outage and
        every ``UPKEEP_EVERY``-th with the upkeep, ``Presence.beat``); False
        (logged at DEBUG once per outage) when Redis could not be reached."""
        if self.status is not None:
            s = self.status()
            self.info.jobs_done = int(s.get("jobs_done", 0))
            self.info.running = int(s.get("running", 0))
            self.info.concurrency = int(s.get("concurrency", self.info.concurrency))
            self.info.running_jobs = list(s.get("running_jobs", ()))[:RUNNING_SHOWN]
        upkeep = self.beats % UPKEEP_EVERY == 0 or self._failing  # the first one, then now and then
        try:
            self.mq.presence.beat(self.info, self.interval_s, upkeep=upkeep)
        except EchoMQError as err:
            if not self._failing:  # the runner reports the outage itself
                log.debug("heartbeat of %s %s failed: %s", self.info.kind, self.info.id, err)
            self._failing = True
            return False
        self._failing = False
        self.beats += 1
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
            served = self.info.queues if self.info.kind == "worker" else ()
            self.mq.presence.leave(self.info.id, served)
        except EchoMQError as err:  # it leaves the list when its key expires
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
    process_id: str | None = None,
) -> Heartbeat | None:
    """What a runner does as it starts (docs/explanation/house.md#monitoring): with ``warn`` (a
    logger), warn about queues known nowhere (``unknown_queue_warning``;
    skipped while Redis is down: the runner reports that); then, unless
    ``register`` is off, start the ``Heartbeat`` that lists it as
    ``process_id`` (None: a new id; returned: ``stop()`` it when the runner
    returns)."""
    if warn is not None:
        try:
            warning = unknown_queue_warning(mq, queues)
        except EchoMQError:
            warning = None
        if warning:
            warn.warning("%s", warning)
    if not register:
        return None
    return Heartbeat(
        mq, kind, queues, beat_s, status=status, concurrency=concurrency, process_id=process_id
    ).start()


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
    names = set(mq.presence.queues()) | set(settings_queues()) | set(extra)
    for proc in mq.presence.live_processes():
        names.update(proc.queues)
    return sorted(names)


def unknown_queue_warning(mq, queues) -> str | None:
    """The warning a worker logs when it starts on queues that no job or
    setting has used: names them and the known ones; None when every queue
    is known, or when nothing is known at all (a fresh Redis and no
    ``ECHOMQ["QUEUES"]``: workers often start before the first job). Raises
    redis-py errors."""
    known = set(mq.presence.queues()) | set(settings_queues())
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
