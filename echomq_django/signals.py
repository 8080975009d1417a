"""Django signals for job transitions (DESIGN §8; issue "Workers").

Each is sent with ``send_robust`` by the process that saw the transition: a
worker for what its own ``complete`` / ``fail`` did (including a same-queue
parent it released or failed in the same script), a pump for what its sweep
did (cross-queue deliveries, lease recovery). ``sender`` is the ``Worker`` or
``Pump`` instance. Every signal carries ``queue`` (str), ``job_id`` (str) and
``job_name`` (str); ``job_completed`` adds ``result`` (decoded JSON), the
others ``error`` (str). A receiver that raises is logged at ERROR and never
stops the sender.

    job_completed   a job completed
    job_failed      a job failed and will be retried (``run_at``: ms or None)
    job_dead        a job went dead (attempts exhausted, stalled, or failed by
                    a child)
    parent_released a parent's last child resolved; it is now pending
    flow_failed     a parent went dead because a child failed it (``fp``)
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


def send(signal: Signal, sender, **kwargs) -> None:
    """``signal.send_robust`` that logs every receiver's exception."""
    if not signal.has_listeners(sender):
        return
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            log.error("signal receiver %r raised %r for %s/%s", receiver, response,
                      kwargs.get("queue"), kwargs.get("job_id"), exc_info=response)


def send_outcome(sender, mq, outcome, skip: tuple[str, str] | None = None) -> None:
    """Send ``job_dead``, ``flow_failed`` and ``parent_released`` for what one
    script's ``Outcome`` moved; reads name and error only when someone listens.
    ``skip`` is a ``(queue, id)`` whose own signal the caller sends itself."""
    groups = ((job_dead, outcome.dead), (flow_failed, outcome.flow_failed),
              (parent_released, outcome.released))
    for signal, pairs in groups:
        if not pairs or not signal.has_listeners(sender):
            continue
        for queue, job_id in pairs:
            if (queue, job_id) == skip and signal is job_dead:
                continue
            try:
                job = mq.get_job(queue, job_id)
            except Exception:  # gone already (retention): still announce it
                name, error = "", None
            else:
                name, error = job.name, job.error
            kwargs = dict(queue=queue, job_id=job_id, job_name=name)
            if signal is not parent_released:
                kwargs["error"] = error
            send(signal, sender, **kwargs)
