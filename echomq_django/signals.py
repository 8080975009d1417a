"""Django signals for job transitions (docs/explanation/protocol.md#durable-signal-events).

Durable (sent at least once, in order per queue, by a ``Dispatcher`` from
the events the transition scripts wrote; ``sender`` is that dispatcher, see
``runners/dispatcher.py``), each with ``queue`` (str), ``job_id``
(str), ``ref`` (the job's ``JobRef``, docs/howto/read-flows.md#job-references),
``job_name`` (str) and ``event_id`` (str, ``"<queue>:<stream id>"``, the
same on a repeat):

    job_completed   ``result``: the handler's return value
    job_dead        ``error`` (str); attempts exhausted, failed with dead=True,
                    stalled too often, failed by a child, or cancelled
    parent_released nothing more; the parent's last child resolved, it runs next
    flow_failed     ``error`` (str) and ``child`` (the ``JobRef`` of the child
                    that failed it, or None): a parent went dead because a
                    child failed it (``fp``); ``job_dead`` follows for it. The
                    parent's error: ``"failed by child <queue>/<id>: "`` and
                    the first line of the child's (at most 1,000 characters of
                    it); the child's whole error is its own and in the
                    parent's ``dependencies().failed``
    job_cancelled   ``error`` (str): a cancel killed the job; ``job_dead`` follows

In-process (sent once, by the worker that ran the attempt, after Redis
recorded it; ``sender`` is that ``Worker``; with ``queue``, ``job_id``,
``ref`` and ``job_name`` as above):

    job_failed      ``error`` (str: "ExcType: message" + trimmed traceback)
                    and ``run_at`` (ms since the epoch of the next attempt, or
                    None when it is pending again at once); it will be retried

A receiver that raises is logged at ERROR; a worker goes on, a dispatcher
retries it and then dead-letters the event (``runners/dispatcher.py``).
"""

from __future__ import annotations

import logging

from django.dispatch import Signal

log = logging.getLogger("echomq_django.signals")

job_completed = Signal()
job_failed = Signal()
job_dead = Signal()
parent_released = Signal()
flow_failed = Signal()
job_cancelled = Signal()  # durable only: sent by the dispatcher for a cancel


def send(signal: Signal, sender, **kwargs) -> None:
    """``signal.send_robust`` that logs every receiver's exception (the
    worker's in-process ``job_failed``)."""
    if not signal.has_listeners(sender):
        return
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            log.error(
                "signal receiver %r raised %r for %s/%s",
                receiver,
                response,
                kwargs.get("queue"),
                kwargs.get("job_id"),
                exc_info=response,
            )
