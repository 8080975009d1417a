"""What an operator changes while the queues run, over the ``EchoMQ`` built
from settings (docs/explanation/house.md, "api/"):
a queue's concurrency cap, one group's pause and cap, and periodic
entries added at run time (``schedules``). Stored in Redis, so every worker, pump and process sees a
change without a restart or a deploy.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from ..conf import config, get_mq
from ..handlers import registered
from ..protocol.control.schedules import unpaused
from ..runners.periodic import Entry, entries, problems


def set_concurrency(queue: str, n: int | None) -> None:
    """At most ``n`` (int, 1-1,000,000) jobs of ``queue`` active at once
    across all workers, from the next claim on; ``None`` drops the run-time
    cap, so the queue's ``CONCURRENCY`` setting applies again (or none).
    Raises ``ValueError`` for a bad queue name or ``n``, before any write;
    ``RedisUnavailable`` when Redis cannot be reached.
    docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
    get_mq().limits.set_concurrency(queue, n)


def get_concurrency(queue: str) -> int | None:
    """The concurrency cap claims of ``queue`` apply now (jobs): the run-time
    one when set, else the ``CONCURRENCY`` setting; None when there is none.
    Raises ``ValueError`` for a bad queue name, ``RedisUnavailable``.
    docs/howto/priorities-rate-limits.md#at-most-n-at-once-concurrency"""
    return get_mq().limits.concurrency(queue)


def pause_group(queue: str, group: str) -> bool:
    """Stop claims of ``group``'s jobs on ``queue``; adds go on and its
    active jobs run on. True when it changed, False when it was paused
    already. Raises ``ValueError`` for a bad queue or group name (nothing
    written), ``RedisUnavailable``. docs/howto/fair-queues.md#pausing-one-customer"""
    return get_mq().groups.pause(queue, group)


def resume_group(queue: str, group: str) -> bool:
    """Claims of ``group``'s jobs on ``queue`` go on (its workers are woken).
    True when it changed, False when it was not paused. Raises
    ``ValueError`` for a bad name, ``RedisUnavailable``.
    docs/howto/fair-queues.md#pausing-one-customer"""
    return get_mq().groups.resume(queue, group)


def set_group_concurrency(queue: str, group: str, n: int | None) -> None:
    """At most ``n`` (int, 1-1,000,000) of ``group``'s jobs on ``queue``
    active at once, from the next claim on; ``None`` drops the group's own
    cap (the queue's ``GROUP_CONCURRENCY`` applies again, or none). Raises
    ``ValueError`` for a bad name or ``n``, before any write;
    ``RedisUnavailable``. docs/howto/fair-queues.md#a-bigger-share-for-one-customer"""
    get_mq().groups.set_concurrency(queue, group, n)


def set_group_rate_limit(queue: str, group: str, limit: dict | None) -> None:
    """At most ``limit["MAX"]`` of ``group``'s jobs on ``queue`` started per
    fixed window of ``limit["PER_MS"]`` ms, from the next claim on; ``None``
    drops the group's own (the queue's ``GROUP_RATE_LIMIT`` applies again, or
    none). Raises ``ValueError`` for a bad name or limit, before any write;
    ``RedisUnavailable``. docs/howto/fair-queues.md#a-rate-limit-per-customer"""
    get_mq().groups.set_rate_limit(queue, group, limit)


def get_group_concurrency(queue: str, group: str) -> int | None:
    """The cap claims apply to ``group`` of ``queue`` now (jobs): its own
    when set, else ``GROUP_CONCURRENCY``; None when there is none. Raises
    ``ValueError`` for a bad name, ``RedisUnavailable``.
    docs/howto/fair-queues.md#a-bigger-share-for-one-customer"""
    return get_mq().groups.concurrency(queue, group)


class Schedules:
    """Periodic entries added, changed and removed at run time
    (docs/howto/periodic.md#schedules-at-run-time), beside the read-only
    ``ECHOMQ["SCHEDULE"]`` entries: ``emq.schedules``. Each is kept in Redis
    on its queue (``P:{q}:schedules``) and fired by the pumps of that queue
    (``runpump``, ``runworker --pump``) like a settings entry: the same
    ``<entry>-<tick ms>`` job ids and marks, so each tick fires once however
    many pumps run. A pump reads its queues' run-time entries at each sweep
    (``--sweep-interval``), so a new entry fires from its first tick after
    that. Entry names are unique across queues and the settings."""

    def upsert(
        self,
        name: str,
        *,
        handler: str,
        queue: str,
        cron: str | None = None,
        every_s: int | None = None,
        payload: Any = None,
        tz: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict:
        """Add or replace entry ``name`` (1-100 id-safe characters): the job
        ``handler`` (a registered job name) on ``queue``, with ``payload``
        (JSON), every ``every_s`` s (ticks at whole multiples since the
        epoch) or by ``cron`` (five fields, in ``tz``, default
        ``TIME_ZONE``); ``priority``, ``max_attempts``, ``timeout_ms`` (ms)
        as for ``enqueue``. Its first job is its first tick after this call
        (a change keeps the entry's last fired tick, and a paused entry
        stays paused). Returns the entry as
        ``list()`` shows it. Raises ``ValueError`` naming the rule and its
        check id (``echomq_django.E052``-``E058``, the settings' rules: an
        unknown handler is E056, a cron that never fires E054) or a name the
        settings hold (read-only), before any write; ``EchoMQError`` when the
        queue holds 1,000 run-time entries; ``RedisUnavailable``."""
        if name in (config().get("SCHEDULE") or {}):
            raise ValueError(
                f"periodic entry {name!r} is in ECHOMQ['SCHEDULE']: settings entries are "
                "read-only at run time (change them in the settings, or pick another name)"
            )
        spec = {"name": handler, "queue": queue, "payload": payload}
        given = {"cron": cron, "every_s": every_s, "tz": tz, "priority": priority}
        given |= {"max_attempts": max_attempts, "timeout_ms": timeout_ms}
        spec |= {k: v for k, v in given.items() if v is not None}
        found = problems({"SCHEDULE": {name: spec}}, registered())
        if found:
            raise ValueError(
                "; ".join(f"{message} ({cid}; {hint})" for cid, message, hint in found)
            )
        (entry,) = entries({name: spec}, settings.TIME_ZONE or "UTC")
        mq = get_mq()
        paused = False
        for other in self._stored(mq):
            if other["entry"] == name:
                paused = other.get("paused", False)
                if other["queue"] != queue:
                    mq.schedule_store.delete(other["queue"], name)  # it moved to another queue
        mq.schedule_store.put(queue, name, {**spec, "paused": True} if paused else spec)
        mq.timers.advance_schedule(queue, name, entry.last_tick(mq.clock()), "init")
        return self._row(mq, entry, spec, read_only=False, paused=paused)

    def remove(self, name: str) -> bool:
        """Remove run-time entry ``name`` (no more jobs from it; jobs it added
        stay); True when there was one. Raises ``ValueError`` for a settings
        entry (read-only), ``RedisUnavailable``."""
        if name in (config().get("SCHEDULE") or {}):
            raise ValueError(f"periodic entry {name!r} is in ECHOMQ['SCHEDULE']: read-only")
        mq = get_mq()
        gone = False
        for row in self._stored(mq):
            if row["entry"] == name:
                gone = mq.schedule_store.delete(row["queue"], name) or gone
        return gone

    def list(self) -> list[dict]:
        """Every periodic entry, the settings' first, then the run-time ones by
        name: ``{entry, name, queue, schedule, payload, last_tick, next_tick,
        read_only, paused}`` (ms since the epoch; ``last_tick`` None before
        the first mark; ``read_only`` True for a settings entry, which is
        never paused). Raises ``RedisUnavailable``."""
        mq = get_mq()
        tz = settings.TIME_ZONE or "UTC"
        fixed = entries(config().get("SCHEDULE") or {}, tz)
        rows = [self._row(mq, e, {"payload": e.payload}, read_only=True) for e in fixed]
        return rows + sorted(self._stored(mq), key=lambda r: r["entry"])

    def get(self, name: str) -> dict:
        """Run-time entry ``name`` as ``upsert`` takes it: ``{handler, queue,
        cron or every_s, payload, tz, priority, max_attempts, timeout_ms}``
        (the ones it was given) plus ``paused``. Raises ``ValueError`` for a
        settings entry (read-only) or no such entry, ``RedisUnavailable``."""
        _queue, spec, paused = self._find(get_mq(), name)
        given = {("handler" if k == "name" else k): v for k, v in spec.items()}
        return {**given, "paused": paused}

    def pause(self, name: str) -> bool:
        """Stop run-time entry ``name`` firing until ``resume`` (its ticks
        meanwhile are skipped, not made up); True when it was running.
        Raises ``ValueError`` for a settings entry (read-only: change the
        settings) or no such entry, ``RedisUnavailable``."""
        return self._set_paused(name, True)

    def resume(self, name: str) -> bool:
        """Let paused run-time entry ``name`` fire again, from its first tick
        after this call; True when it was paused. Raises as ``pause``."""
        return self._set_paused(name, False)

    def run_now(self, name: str) -> tuple[str, str]:
        """Add entry ``name``'s job now, once, outside its ticks (a settings
        entry too; a paused one too): the job ``<name>-now-<ms>`` with the
        entry's payload and options. Its ticks and marks are unchanged.
        Returns ``(queue, job id)``. Raises ``ValueError`` for no such
        entry, ``DuplicateJob`` for a second call within the same ms,
        ``RedisUnavailable``."""
        mq = get_mq()
        tz = settings.TIME_ZONE or "UTC"
        fixed = [e for e in entries(config().get("SCHEDULE") or {}, tz) if e.key == name]
        if fixed:
            entry = fixed[0]
        else:
            try:
                _queue, spec, _paused = self._find(mq, name)
            except ValueError:  # name every entry Run now takes, the settings' too
                known = sorted(
                    [*(config().get("SCHEDULE") or {}), *(r["entry"] for r in self._stored(mq))]
                )
                raise ValueError(
                    f"no periodic entry {name!r}; entries: {', '.join(known) or '(none)'}"
                ) from None
            (entry,) = entries({name: spec}, spec.get("tz", tz))
        job_id = f"{name}-now-{mq.clock()}"
        mq.enqueue(entry.queue, entry.name, entry.payload, job_id=job_id, **entry.options)
        return entry.queue, job_id

    def _find(self, mq, name: str) -> tuple[str, dict, bool]:
        """``(queue, spec, paused)`` of run-time entry ``name``; raises
        ``ValueError`` for a settings entry or no such entry."""
        if name in (config().get("SCHEDULE") or {}):
            raise ValueError(f"periodic entry {name!r} is in ECHOMQ['SCHEDULE']: read-only")
        for queue, found in mq.schedule_store.read(mq.presence.queues()).items():
            if name in found:
                return (queue, *unpaused(found[name]))
        known = sorted(r["entry"] for r in self._stored(mq))
        raise ValueError(
            f"no run-time periodic entry {name!r}; run-time entries: {', '.join(known) or '(none)'}"
        )

    def _set_paused(self, name: str, paused: bool) -> bool:
        mq = get_mq()
        queue, spec, was = self._find(mq, name)
        if was == paused:
            return False
        mq.schedule_store.put(queue, name, {**spec, "paused": True} if paused else spec)
        if not paused:  # the ticks it slept through are skipped: mark the latest as fired
            (entry,) = entries({name: spec}, spec.get("tz", settings.TIME_ZONE or "UTC"))
            mq.timers.advance_schedule(queue, name, entry.last_tick(mq.clock()), "fire")
        return True

    def _stored(self, mq) -> list[dict]:
        """The run-time entries of every known queue, as ``list()`` rows."""
        queues = mq.presence.queues()
        rows = []
        for queue, found in mq.schedule_store.read(queues).items():
            for key, stored in found.items():
                spec, paused = unpaused(stored)
                try:
                    (entry,) = entries({key: spec}, settings.TIME_ZONE or "UTC")
                except Exception:
                    rows.append(
                        {"entry": key, "queue": queue, "name": spec.get("name"), "paused": paused}
                    )
                    continue
                rows.append(self._row(mq, entry, spec, read_only=False, paused=paused))
        return rows

    @staticmethod
    def _row(mq, entry: Entry, spec: dict, read_only: bool, paused: bool = False) -> dict:
        return {
            "entry": entry.key,
            "name": entry.name,
            "queue": entry.queue,
            "schedule": entry.cron or f"every {entry.every_s} s",
            "payload": spec.get("payload"),
            "last_tick": mq.timers.schedule_last(entry.queue, entry.key),
            "next_tick": entry.next_tick(mq.clock()),
            "read_only": read_only,
            "paused": paused,
        }


schedules = Schedules()
