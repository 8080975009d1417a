"""The live-workers page's commands (docs/howto/operate-workers.md#from-the-admin):
shutdown, drain, pool-grow N and pool-shrink N sent to one worker, through
the call ``echomq_control`` makes (``mq.commands.send``). Guarded by the
``echomq_django.command_worker`` permission, recorded as one ``LogEntry``
per command (on the queue model, object id the worker's id), and each
worker's reply shown on the page: the message after the send waits up to
``REPLY_WAIT_S`` for it, the page lists the recent commands with their state.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect

from ..conf import get_mq
from ..core.exceptions import EchoMQError
from ..protocol.control.commands import COMMANDS, SIZED

COMMAND_PERMISSION = "echomq_django.command_worker"
REPLY_WAIT_S = 2.0  # how long the page waits for a worker's acknowledgement (s)
RECENT_SHOWN = 20  # commands the page lists


def can_command(request) -> bool:
    """True when the user may send commands to workers."""
    return request.user.has_perm(COMMAND_PERMISSION)


def page_context(mq, request) -> dict:
    """What the live-workers page adds for commands: ``can_command``,
    ``commands`` (``COMMANDS``), ``sized`` (those taking N) and ``recent``
    (the newest ``RECENT_SHOWN`` records, ``mq.commands.recent``, each
    with ``ago_s``, seconds since it was sent; empty when Redis cannot be
    read: the page says so already)."""
    try:
        recent, now = mq.commands.recent(RECENT_SHOWN), mq.clock()
    except EchoMQError:
        recent, now = [], 0
    for row in recent:
        row["ago_s"] = max(0.0, (now - row["sent_at"]) / 1000)
    return {
        "can_command": can_command(request),
        "commands": COMMANDS,
        "sized": SIZED,
        "recent_commands": recent,
    }


def post(request, model, back: str) -> HttpResponseRedirect:
    """Send the command the page's form posted (``worker``, ``command``,
    ``n``), say how the worker replied, log it against ``model`` (the
    queue mirror's model) and go back to ``back``. Raises
    ``PermissionDenied`` without the permission; a bad command, N or
    worker id is an error message, nothing sent."""
    if not can_command(request):
        raise PermissionDenied
    worker, name = request.POST.get("worker", ""), request.POST.get("command", "")
    raw = request.POST.get("n", "").strip()
    mq = get_mq()
    n = int(raw) if raw.isdigit() else (raw or None)  # the send's check names a bad one
    try:
        [(cid, _)] = mq.commands.send(name, n, worker=worker)
        row = mq.commands.wait(cid, REPLY_WAIT_S)
    except (ValueError, EchoMQError) as err:
        messages.error(request, f"Not sent: {err}")
        return HttpResponseRedirect(back)
    what = f"{name} {n}" if n is not None else name
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type_id=ContentType.objects.get_for_model(model).pk,
        object_id=worker,
        object_repr=f"worker {worker}"[:200],
        action_flag=CHANGE,
        change_message=f"Sent {what} (admin command)",
    )
    state = row["state"] if row else "sent"
    if state == "sent":
        messages.warning(request, f"Sent {what} to {worker}: no reply yet.")
    else:
        detail = f": {row['detail']}" if row["detail"] else ""
        messages.success(request, f"Sent {what} to {worker}: {state}{detail}.")
    return HttpResponseRedirect(back)
