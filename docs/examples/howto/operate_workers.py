"""Operator commands to running workers (docs/howto/operate-workers.md)."""

from django.core.management import call_command

from echomq_django.conf import get_mq


def grow(worker_id, n):
    """What ``manage.py echomq_control pool-grow N --worker ID`` sends:
    returns the worker's reply, e.g. ``{"state": "done", "detail": "2 -> 4
    handlers", ...}``, once it came (at most 5 s)."""
    mq = get_mq()
    [(command_id, _)] = mq.commands.send("pool-grow", n, worker=worker_id)
    return mq.commands.wait(command_id, timeout_s=5)


def drain_every_worker():
    """Before a deploy: every worker stops claiming and exits once its
    running jobs have finished; waits up to 60 s for them."""
    call_command("echomq_control", "drain", "--all", "--wait", "60")
