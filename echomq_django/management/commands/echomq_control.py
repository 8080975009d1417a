"""``./manage.py echomq_control shutdown|drain|pool-grow N|pool-shrink N
(--worker ID | --all) [--wait S]``: send an operator command to running
workers and print each one's reply (docs/reference/commands.md#echomq_control,
docs/howto/operate-workers.md).

One line per worker: ``<worker id>: <command> <state>[: detail]``, the state
``acknowledged``, ``done`` or ``expired`` as the worker replied within
``--wait`` seconds (a blocking read of the command's record), or ``sent``
when it did not. Exit 1 with a one-line reason for a bad command or N, an
unknown worker id (naming the live ones; nothing is sent), an unreachable
Redis, or a worker whose command was not ``done`` within ``--wait`` (not
replied, only acknowledged, e.g. a drain still running, or expired).
``--wait 0`` sends and exits 0 without waiting (each line says ``sent``).
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from echomq_django.conf import get_mq
from echomq_django.core.exceptions import EchoMQError
from echomq_django.protocol.control.commands import COMMANDS, PENDING_TTL_MS, SIZED

MAX_WAIT_S = 86_400  # the longest --wait (s)


class Command(BaseCommand):
    help = (
        "Send a command to running workers: shutdown (as SIGTERM), drain (no more claims; "
        "exit once the running jobs finish), pool-grow N / pool-shrink N (handlers, within "
        "--autoscale's MAX and MIN, or 1 and twice the starting size of a fixed pool). "
        "Prints each worker's reply. See docs/howto/operate-workers.md."
    )

    def add_arguments(self, parser):
        parser.add_argument(  # checked by mq.commands.send: a one-line error, exit 1
            "command", metavar="COMMAND", help="one of " + ", ".join(COMMANDS)
        )
        parser.add_argument(
            "n", nargs="?", type=int, metavar="N", help="handlers (pool-grow, pool-shrink only)"
        )
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--worker", metavar="ID", help="one live worker, by its id")
        target.add_argument("--all", action="store_true", help="every live worker")
        parser.add_argument(
            "--wait",
            type=float,
            default=10.0,
            metavar="S",
            help="seconds to wait for the replies (0 to 86,400; default 10; 0: send and exit 0): "
            "a resize is done at once, a shutdown or drain once the worker stopped",
        )

    def handle(self, *args, **opts):
        name, n, wait = opts["command"], opts["n"], opts["wait"]
        if not 0 <= wait <= MAX_WAIT_S:  # NaN and inf fail too
            raise CommandError(
                f"echomq_control: --wait must be a number of seconds from 0 to "
                f"{MAX_WAIT_S:,} (a day), got {wait}"
            )
        if name in SIZED and n is None:
            raise CommandError(f"echomq_control: {name} needs N, the number of handlers")
        mq = get_mq()
        try:
            sent = mq.commands.send(name, n, worker=opts["worker"], all_workers=opts["all"])
            deadline, undone = time.monotonic() + wait, 0
            if not wait:  # --wait 0: sent, not waited for
                for _cid, worker in sent:
                    self.stdout.write(f"{worker}: {name} sent")
                return
            for cid, worker in sent:
                row = mq.commands.wait(cid, max(0.0, deadline - time.monotonic()))
                state = row["state"] if row else "sent"
                detail = row["detail"] if row and row["detail"] else ""
                if state == "sent":
                    detail = f"no reply within {wait:g}s"
                undone += state != "done"
                self.stdout.write(f"{worker}: {name} {state}" + (f": {detail}" if detail else ""))
        except ValueError as err:
            raise CommandError(f"echomq_control: {err}") from None
        except EchoMQError as err:  # RedisUnavailable says where it tried
            raise CommandError(f"echomq_control: {err}") from None
        if undone:
            raise CommandError(
                f"echomq_control: {undone} of {len(sent)} workers had not done {name} within "
                f"{wait:g}s (a command waits for its worker up to "
                f"{PENDING_TTL_MS // 60_000} minutes; a drain ends when its jobs do)"
            )
