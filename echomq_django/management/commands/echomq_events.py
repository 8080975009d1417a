"""``./manage.py echomq_events QUEUE... [--since ID] [--kinds a,b] [--block S]
[--count N] [--json]``: print the queues' events as they happen, one line
each, until Ctrl-C (docs/reference/commands.md#echomq_events). A line is
``<event id> <queue> <kind> <job id> [field=value...]``, or with ``--json``
one JSON object. A follower that fell behind the stream's cap prints a
``gap`` line. Exit 1 with a one-line reason for a bad flag or queue name
(before any Redis I/O) or an unreachable Redis.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from echomq_django.conf import get_mq
from echomq_django.core.events import Gap
from echomq_django.core.exceptions import EchoMQError


class Command(BaseCommand):
    help = (
        "Follow the events of one or more queues (added, active, progress, completed, "
        "failed, dead, ...) and print one line per event until Ctrl-C. At most once: "
        "nothing is acknowledged, any number of followers may run. See "
        "docs/howto/events.md."
    )

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="queues to follow")
        parser.add_argument(
            "--since",
            metavar="ID",
            help="start after this stream id ('<ms>-<seq>', '0' for all the stream still "
            "holds) or after this event (its id as printed, '<ms>-<seq>:<k>' for one of an "
            "entry's several); default: only what happens from now",
        )
        parser.add_argument(
            "--kinds", metavar="A,B", help="only these kinds, comma-separated (default: all)"
        )
        parser.add_argument(
            "--block",
            type=float,
            metavar="S",
            help="stop once nothing happened for S seconds (>= 0); default: follow until Ctrl-C",
        )
        parser.add_argument("--count", type=int, metavar="N", help="stop after N events (>= 1)")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")

    def handle(self, *args, **opts):
        count = opts["count"]
        if count is not None and count < 1:
            raise CommandError(f"echomq_events: --count must be >= 1, got {count}")
        kinds = opts["kinds"].split(",") if opts["kinds"] is not None else None
        try:
            follow = get_mq().events(opts["queues"], opts["since"], kinds, opts["block"])
        except (ValueError, TypeError) as err:
            raise CommandError(f"echomq_events: {err}") from None
        shown = 0
        try:
            with follow:
                for item in follow:
                    self.stdout.write(self.line(item, opts["json"]))
                    shown += 1
                    if count is not None and shown >= count:
                        return
        except EchoMQError as err:  # RedisUnavailable says where it tried
            raise CommandError(f"echomq_events: {err}") from None
        except KeyboardInterrupt:
            return

    def line(self, item, as_json: bool) -> str:
        """One event (or gap) as a line of text or of JSON."""
        if isinstance(item, Gap):
            row = {"id": item.id, "queue": item.queue, "kind": item.kind, "oldest": item.oldest}
            if as_json:
                return json.dumps(row)
            return f"{item.id} {item.queue} gap (entries before {item.oldest} may be lost)"
        row = {
            "id": item.id,
            "queue": item.queue,
            "kind": item.kind,
            "job_id": item.job_id,
            "at_ms": item.at_ms,
            "fields": dict(item.fields),
        }
        if as_json:
            return json.dumps(row)
        extra = " ".join(f"{k}={v}" for k, v in item.fields.items())
        return " ".join(x for x in (item.id, item.queue, item.kind, item.job_id or "-", extra) if x)
