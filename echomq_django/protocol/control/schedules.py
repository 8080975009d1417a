"""``mq.schedule_store``: periodic entries added at run time, kept per queue
in the hash ``P:{q}:schedules`` (entry name -> its spec as JSON), beside
the entries of ``ECHOMQ["SCHEDULE"]`` (docs/howto/periodic.md#schedules-at-run-time).

This part only stores and reads; the checks (a known handler, a cron that
fires, a name not taken by the settings) are ``emq.schedules``' and the
firing is the pumps' (``runners/periodic.py``: the same marks and job ids
as a settings entry, so each tick fires once however many pumps run). No
script of its own.
"""

from __future__ import annotations

import json

from ...core.exceptions import EchoMQError
from ...core.keyspace import validate_id, validate_queue
from ..wire import Part

MAX_RUNTIME_ENTRIES = 1000  # run-time entries one queue may hold


class ScheduleStore(Part):
    """Run-time periodic entries, per queue."""

    def put(self, queue: str, entry: str, spec: dict) -> bool:
        """Store ``spec`` (a checked entry dict: ``name``, ``queue``, ``cron``
        or ``every_s``, ...) as ``entry`` of ``queue``; True when it is new.
        Raises ``ValueError`` for a bad queue or entry name, ``EchoMQError``
        when the queue holds ``MAX_RUNTIME_ENTRIES`` already (nothing
        written), ``RedisUnavailable``."""
        validate_queue(queue)
        validate_id(entry)
        key = self.keys.queue(queue).schedules
        self.wire.note_queues((queue,))  # list() and remove() find it through P:queues
        pipe = self.client.pipeline(transaction=False)
        pipe.hexists(key, entry)
        pipe.hlen(key)
        there, size = pipe.execute()
        if not there and size >= MAX_RUNTIME_ENTRIES:
            raise EchoMQError(
                f"queue {queue!r} holds {size} run-time periodic entries, the most it may: "
                "remove one first"
            )
        return bool(self.client.hset(key, entry, json.dumps(spec, separators=(",", ":"))))

    def delete(self, queue: str, entry: str) -> bool:
        """Forget ``entry`` of ``queue`` and its last-tick mark; True when it
        was there. Raises ``ValueError`` for a bad name, ``RedisUnavailable``."""
        validate_queue(queue)
        k = self.keys.queue(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(k.schedules, validate_id(entry))
        pipe.delete(k.schedule(entry))
        return bool(pipe.execute()[0])

    def read(self, queues, running_only: bool = False) -> dict[str, dict[str, dict]]:
        """``{queue: {entry: spec}}`` of the run-time entries of ``queues``
        (queues with none left out): one pipelined ``HGETALL`` per queue.
        A paused entry's spec holds ``"paused": true``; ``running_only``
        leaves paused entries out (what the pumps fire). Raises
        ``RedisUnavailable``."""
        names = [validate_queue(q) for q in dict.fromkeys(queues)]
        if not names:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for q in names:
            pipe.hgetall(self.keys.queue(q).schedules)
        out = {}
        for q, found in zip(names, pipe.execute(), strict=True):
            specs = {_text(k): json.loads(v) for k, v in found.items()}
            if running_only:
                specs = {k: v for k, v in specs.items() if not v.get("paused")}
            if specs:
                out[q] = specs
        return out


def unpaused(stored: dict) -> tuple[dict, bool]:
    """A stored run-time entry (``mq.schedule_store``) as ``(its spec, as
    ``SCHEDULE`` holds one, whether it is paused)``: a paused entry keeps
    ``"paused": true`` beside its spec (docs/howto/periodic.md#schedules-at-run-time)."""
    spec = {k: v for k, v in stored.items() if k != "paused"}
    return spec, bool(stored.get("paused"))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
