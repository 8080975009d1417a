"""Periodic jobs from ``ECHOMQ["SCHEDULE"]``
(docs/explanation/protocol.md#scheduling), and the system
checks of ``SCHEDULE`` (ids ``echomq_django.E052``-``E058``; a queue's
``RATE_LIMIT`` and ``TIMEOUT_MS``, E050, E051 and E059, are ``conf.timing``'s).

Shape::

    ECHOMQ["SCHEDULE"] = {
        "nightly-report": {"name": "reports.nightly", "queue": "reports",
                           "cron": "0 3 * * *", "payload": {}},
        "heartbeat": {"name": "ops.ping", "queue": "ops", "every_s": 60},
    }

Each entry has ``name`` (the handler), ``queue``, exactly one of ``cron`` (a
five-field cron expression, read by ``croniter`` in ``tz``, default Django's
``TIME_ZONE``) or ``every_s`` (seconds; ticks at whole multiples since the
epoch), and optionally ``payload`` (JSON), ``priority``, ``max_attempts``,
``timeout_ms``.

Exactly one job per tick, however many processes run a ``Scheduler``: a tick's
job has the id ``<entry>-<tick ms>``, so a second add of it is refused by the
id gate, and the entry's mark ``P:{q}:schedule:<entry>`` (the last tick fired,
only moving forward) tells every process which tick came last. A first start
only sets the mark (no past tick fires); a restart fires the latest tick it
missed (one job, not one per missed tick), so a restart shorter than the
period loses nothing. Daylight-saving changes: ``Entry.last_tick``
(docs/howto/periodic.md#periodic-jobs-and-the-clock).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..conf import config
from ..conf.timing import timing_problems, whole
from ..core.exceptions import DuplicateJob, PayloadError
from ..core.jobs import MAX_PAYLOAD_BYTES
from ..core.keyspace import validate_id, validate_queue
from ..core.options import check_job_options

log = logging.getLogger("echomq_django.schedule")

ENTRY_KEYS = {"name", "queue", "cron", "every_s", "payload", "priority", "max_attempts",
              "timeout_ms", "tz"}  # fmt: skip
MAX_ENTRY = 100  # characters of an entry name: its job ids are <entry>-<13 digits>
MAX_EVERY_S = 366 * 86_400


def _croniter():
    try:
        from croniter import croniter
    except ImportError:  # the optional 'cron' extra
        return None
    return croniter


@dataclass
class Entry:
    """One periodic job: ``key`` (its name in SCHEDULE), the job's ``name``
    and ``queue``, ``cron`` or ``every_s`` (s), ``payload``, ``options``
    (``enqueue`` keywords) and ``tz`` (a cron's time zone)."""

    key: str
    name: str
    queue: str
    cron: str | None = None
    every_s: int | None = None
    payload: Any = None
    options: dict = field(default_factory=dict)
    tz: str = "UTC"

    def last_tick(self, now_ms: int) -> int:
        """The latest tick at or before ``now_ms`` (ms since the epoch).
        Daylight-saving changes (docs/howto/periodic.md#periodic-jobs-and-the-clock):
        a wall-clock time that never happens (spring forward) ticks once, at
        the first instant after the gap (croniter's answer, and cron's); one
        that happens twice (fall back) ticks once, at its first occurrence,
        for a rule with fixed hours, and at both for a rule whose hour field
        is a wildcard (``*``, ``*/n``: it counts elapsed time)."""
        if self.every_s:
            period = self.every_s * 1000
            return now_ms - now_ms % period
        it = _croniter()(self.cron, self._local(now_ms + 1))
        tick = round(it.get_prev(float) * 1000)
        while self._repeat(tick):
            tick = round(it.get_prev(float) * 1000)
        return tick

    def next_tick(self, now_ms: int) -> int:
        """The first tick after ``now_ms`` (ms); the same rules."""
        if self.every_s:
            period = self.every_s * 1000
            return now_ms - now_ms % period + period
        it = _croniter()(self.cron, self._local(now_ms))
        tick = round(it.get_next(float) * 1000)
        while self._repeat(tick):
            tick = round(it.get_next(float) * 1000)
        return tick

    def _local(self, ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ms / 1000, zoneinfo.ZoneInfo(self.tz))

    def _repeat(self, tick: int) -> bool:
        """True for a fixed-hour rule's tick at the second occurrence of a
        wall-clock time (the hour that repeats when the clocks fall back):
        it fired at the first."""
        if "*" in self.cron.split()[1]:
            return False
        local = self._local(tick)
        return local.fold == 1 and local.utcoffset() != local.replace(fold=0).utcoffset()

    def job_id(self, tick: int) -> str:
        """The id of the job of ``tick``: the same in every process."""
        return f"{self.key}-{tick}"


def problems(cfg: dict, handlers: list[str] | None = None) -> list[tuple[str, str, str]]:
    """``(check id, message, hint)`` for each problem of the scheduling
    settings in ``cfg`` (the ``ECHOMQ`` dict): per queue ``RATE_LIMIT`` (E050,
    E059) and ``TIMEOUT_MS`` (E051), ``conf.timing``; ``SCHEDULE`` (E052-E058,
    ``schedule_problems``). ``handlers``: the registered job names, to refuse an
    entry naming none (None: skip that). Settings only, no Redis."""
    return timing_problems(cfg) + schedule_problems(cfg, handlers)


def schedule_problems(cfg: dict, handlers: list[str] | None = None) -> list[tuple[str, str, str]]:
    """``problems`` of ``SCHEDULE`` alone (E052-E058): what the system check of
    the scheduling settings adds to those ``conf.problems()`` finds."""
    out = []
    schedule = cfg.get("SCHEDULE", {})
    if not isinstance(schedule, dict):
        return [
            *out,
            (
                "echomq_django.E052",
                "ECHOMQ['SCHEDULE'] must be a dict of entry name -> entry",
                "Example: {'nightly': {'name': 'reports.nightly', 'queue': 'reports', "
                "'cron': '0 3 * * *'}}",
            ),
        ]
    limit = cfg.get("MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES)
    limit = limit if whole(limit, 1, 2**63) else MAX_PAYLOAD_BYTES  # a bad one is E012's
    for key, spec in schedule.items():
        out += _entry_problems(key, spec, handlers, limit)
    return out


def _fires(croniter, cron: str) -> bool:
    try:  # croniter searches some fifty years ahead, then gives up
        return bool(croniter(cron, dt.datetime(2000, 1, 1)).get_next(float))
    except ValueError:
        return False


def _entry_problems(key: Any, spec: Any, handlers: list[str] | None, limit: int) -> list[tuple]:
    where = f"SCHEDULE entry {key!r}"
    try:
        validate_id(key)
        if len(key) > MAX_ENTRY:
            raise ValueError(f"an entry name is at most {MAX_ENTRY} characters")
    except ValueError as err:
        return [("echomq_django.E052", f"{where}: {err}", "Entry names become job ids.")]
    if not isinstance(spec, dict):
        return [("echomq_django.E052", f"{where} must be a dict", "See ECHOMQ['SCHEDULE'].")]
    unknown = sorted(set(spec) - ENTRY_KEYS)
    missing = sorted({"name", "queue"} - set(spec))
    if unknown or missing:
        return [
            (
                "echomq_django.E053",
                f"{where}: "
                + "; ".join(
                    ([f"unknown keys {unknown}"] if unknown else [])
                    + ([f"missing {missing}"] if missing else [])
                ),
                f"Allowed keys: {', '.join(sorted(ENTRY_KEYS))}.",
            )
        ]
    out = []
    try:
        validate_queue(spec["queue"])
    except ValueError as err:
        out.append(("echomq_django.E053", f"{where}: {err}", "Name a valid queue."))
    has_cron, has_every = "cron" in spec, "every_s" in spec
    if has_cron == has_every:
        out.append(
            (
                "echomq_django.E055",
                f"{where} needs exactly one of 'cron' and 'every_s'",
                "'cron': '*/5 * * * *' or 'every_s': 300.",
            )
        )
    elif has_every and not whole(spec["every_s"], 1, MAX_EVERY_S):
        out.append(
            (
                "echomq_django.E055",
                f"{where}: every_s must be a whole number of seconds from 1 to {MAX_EVERY_S}, "
                f"got {spec['every_s']!r}",
                "Ticks fall on whole multiples of every_s since the epoch.",
            )
        )
    elif has_cron:
        croniter = _croniter()
        if croniter is None:
            out.append(
                (
                    "echomq_django.E057",
                    f"{where} uses 'cron' but croniter is not installed",
                    "pip install 'echomq-django[cron]' (or croniter), or use 'every_s'.",
                )
            )
        elif not isinstance(spec["cron"], str) or not croniter.is_valid(spec["cron"]):
            out.append(
                (
                    "echomq_django.E054",
                    f"{where}: malformed cron expression {spec['cron']!r}",
                    "Five fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * *'.",
                )
            )
        elif not _fires(croniter, spec["cron"]):
            never = f"{where}: cron expression {spec['cron']!r} never fires"
            out.append(("echomq_django.E054", never, "Name a date that exists (not 30 February)."))
    try:
        zoneinfo.ZoneInfo(spec.get("tz", "UTC"))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        out.append(("echomq_django.E058", f"{where}: unknown time zone {spec['tz']!r}",
                    "Use an IANA name such as 'Europe/Paris'."))  # fmt: skip
    if handlers is not None and spec["name"] not in handlers:
        out.append(
            (
                "echomq_django.E056",
                f"{where} names job {spec['name']!r}, which has no handler",
                "Register it with @echomq_django.handler(...) in an installed app's jobs.py.",
            )
        )
    try:
        check_job_options(spec.get("priority", 0), 0, spec.get("timeout_ms"))
        if "max_attempts" in spec and not whole(spec["max_attempts"], 1, 10**6):
            raise ValueError(f"max_attempts must be a whole number >= 1: {spec['max_attempts']!r}")
        text = json.dumps(spec.get("payload"), allow_nan=False, separators=(",", ":"))
        if len(text) > limit:  # ASCII: one byte per character
            raise ValueError(
                f"payload is {len(text)} bytes of JSON; the limit is {limit} bytes "
                "(ECHOMQ MAX_PAYLOAD_BYTES)"
            )
    except (TypeError, ValueError) as err:
        out.append(("echomq_django.E058", f"{where}: {err}", "Fix the entry's values."))
    return out


def entries(schedule: dict, default_tz: str = "UTC") -> list[Entry]:
    """The ``Entry`` objects of a ``SCHEDULE`` dict. Raises
    ``ImproperlyConfigured`` naming every problem (``problems``)."""
    errors = problems({"SCHEDULE": schedule})
    if errors:
        raise ImproperlyConfigured("; ".join(f"{i}: {m} ({h})" for i, m, h in errors))
    out = []
    for key, spec in schedule.items():
        options = {k: spec[k] for k in ("priority", "max_attempts", "timeout_ms") if k in spec}
        out.append(
            Entry(
                key=key,
                name=spec["name"],
                queue=spec["queue"],
                cron=spec.get("cron"),
                every_s=spec.get("every_s"),
                payload=spec.get("payload"),
                options=options,
                tz=spec.get("tz", default_tz),
            )
        )
    return out


class Scheduler:
    """Fires periodic jobs (docs/explanation/protocol.md#scheduling): ``fire_due()`` adds the job of
    every entry whose latest tick has not fired yet, and returns
    ``[(queue, job id)]`` of the jobs this call added; ``next_due()`` is the
    ms (since the epoch) of the next tick of any entry, for the caller's
    wait. ``mq``: an ``EchoMQ``; ``schedule``: a list of ``Entry`` (default:
    from ``ECHOMQ['SCHEDULE']``). Between ticks ``fire_due`` talks to Redis
    not at all (it remembers each entry's mark)."""

    def __init__(self, mq, schedule: list[Entry] | None = None, runtime_queues=()) -> None:
        if schedule is None:
            schedule = entries(config().get("SCHEDULE", {}), settings.TIME_ZONE or "UTC")
        self.mq = mq
        self.fixed = list(schedule)  # from settings: read-only at run time
        self.entries = list(schedule)
        # queues whose run-time entries (emq.schedules) each fire_due reads again
        self.runtime_queues = list(runtime_queues)
        self.marks: dict[str, int] = {}  # entry -> the latest tick known to have fired
        self.fired = 0  # jobs this scheduler added

    @classmethod
    def for_queues(cls, mq, queues: list[str]) -> Scheduler | None:
        """The scheduler of the ``ECHOMQ["SCHEDULE"]`` entries whose queue is
        one of ``queues`` (a pump fires its own queues' entries), with their
        run-time entries (docs/howto/periodic.md#schedules-at-run-time).
        Raises ``ImproperlyConfigured`` for a bad entry."""
        mine = [
            e
            for e in entries(config().get("SCHEDULE", {}), settings.TIME_ZONE or "UTC")
            if e.queue in queues
        ]
        return cls(mq, mine, runtime_queues=queues)

    def fire_due(self) -> list[tuple[str, str]]:
        """Add the job of each entry's latest tick unless it fired already
        (here or in another process); first reads the run-time entries of
        ``runtime_queues`` again (one round trip). Raises ``RedisUnavailable``."""
        if self.runtime_queues:
            self.entries = self.fixed + runtime_entries(self.mq, self.runtime_queues, self.fixed)
        now = self.mq.clock()
        added = []
        for entry in self.entries:
            tick = entry.last_tick(now)
            if self.marks.get(entry.key, -1) >= tick:
                continue
            mark = self.mq.timers.advance_schedule(entry.queue, entry.key, tick, "init")
            if mark < tick:
                job_id = entry.job_id(tick)
                try:
                    self.mq.enqueue(
                        entry.queue, entry.name, entry.payload, job_id=job_id, **entry.options
                    )
                except DuplicateJob:
                    pass  # another process fired this tick first
                except PayloadError as err:  # the check says so (E058): the tick is skipped
                    log.error("periodic job %s: tick skipped, its payload is refused: %s",
                              entry.key, err)  # fmt: skip
                else:
                    added.append((entry.queue, job_id))
                    log.info("periodic job %s fired: %s/%s", entry.key, entry.queue, job_id)
                mark = self.mq.timers.advance_schedule(entry.queue, entry.key, tick, "fire")
            self.marks[entry.key] = mark
        self.fired += len(added)
        return added

    def next_due(self) -> int | None:
        """The ms since the epoch of the next tick of any entry (None: none)."""
        now = self.mq.clock()
        return min((e.next_tick(now) for e in self.entries), default=None)

    def wait_s(self, cap_s: float) -> float:
        """Seconds until the next tick, at most ``cap_s``: how long a loop
        running ``fire_due`` may block."""
        due = self.next_due()
        if due is None:
            return cap_s
        return max(0.0, min(cap_s, (due - self.mq.clock()) / 1000))

    def state(self) -> list[dict]:
        """For stats and the admin: per entry ``{entry, name, queue, schedule,
        last_tick, next_tick}`` (ms; ``last_tick`` None before the first
        mark). One GET per entry."""
        now = self.mq.clock()
        out = []
        for e in self.entries:
            last = self.mq.timers.schedule_last(e.queue, e.key)
            out.append(
                {
                    "entry": e.key,
                    "name": e.name,
                    "queue": e.queue,
                    "schedule": e.cron or f"every {e.every_s} s",
                    "last_tick": last,
                    "next_tick": e.next_tick(now),
                }
            )
        return out


def runtime_entries(mq, queues, fixed: list[Entry]) -> list[Entry]:
    """The run-time entries (``emq.schedules``) of ``queues`` as ``Entry``
    objects, paused ones left out; one whose name a settings entry in
    ``fixed`` has, or that no longer passes the checks here (croniter
    missing), is left out with a WARNING. Raises ``RedisUnavailable``."""
    taken, out = {e.key for e in fixed}, []
    for queue, found in mq.schedule_store.read(queues, running_only=True).items():
        for key, spec in found.items():
            try:
                if key in taken:
                    raise ImproperlyConfigured("ECHOMQ['SCHEDULE'] has an entry of that name")
                out += entries({key: spec}, spec.get("tz", settings.TIME_ZONE or "UTC"))
            except ImproperlyConfigured as err:
                log.warning("run-time periodic entry %s on %s left out: %s", key, queue, err)
    return out


def without_a_pump(mq, queues: list[str]) -> list[Entry]:
    """The ``ECHOMQ["SCHEDULE"]`` entries on ``queues`` that no live pump
    serves (``mq.presence``): periodic jobs fire only under a pump
    (``runpump``, or ``runworker --pump``), so ``runworker`` warns at start
    when this is not empty. Raises ``ImproperlyConfigured`` for a bad entry,
    ``RedisUnavailable``. docs/howto/periodic.md"""
    scheduler = Scheduler.for_queues(mq, queues)
    if not scheduler.entries:
        return []
    live = mq.presence.live_processes()
    pumped = {q for p in live if p.kind == "pump" for q in p.queues}
    return [e for e in scheduler.entries if e.queue not in pumped]


def settings_state(mq) -> list[dict]:
    """``Scheduler.state()`` of every ``ECHOMQ["SCHEDULE"]`` entry, then of
    the run-time ones on known queues, for stats (one GET per entry); ``[]``
    when there is none or the setting is malformed (the checks say so)."""
    try:
        schedule = entries(config().get("SCHEDULE", {}), settings.TIME_ZONE or "UTC")
    except ImproperlyConfigured:
        return []
    scheduler = Scheduler(mq, schedule)
    scheduler.entries = schedule + runtime_entries(mq, mq.presence.queues(), schedule)
    return scheduler.state()
