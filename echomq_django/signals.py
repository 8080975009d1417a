"""Django signals for job transitions (DESIGN §8; issue "Workers").

Each is sent with ``send_robust`` by the process that saw the transition, with
``sender`` = that ``Worker`` or ``Pump`` instance:

* a **worker** (``runworker``) sends ``job_completed``, ``job_failed`` and
  ``job_dead`` for the jobs it ran, once per job, after the batch that
  reported them; and ``parent_released``, ``flow_failed`` and ``job_dead``
  for the other jobs its own ``complete`` / ``fail`` moved in the same script
  (a same-queue parent released or failed by its child, and so on up);
* a **pump** (``runpump``) sends ``parent_released``, ``flow_failed`` and
  ``job_dead`` for what its sweep moved: cross-queue deliveries from an
  outbox, and jobs that died of an expired lease.

So a same-queue flow is announced by workers alone; a cross-queue parent is
released (or failed) on the pump's side.

Every signal carries ``queue`` (str), ``job_id`` (str) and ``job_name`` (str,
"" when the row is gone already). Besides:

    job_completed   ``result``: the handler's return value
    job_failed      ``error`` (str: "ExcType: message" + trimmed traceback)
                    and ``run_at`` (ms since the epoch of the next attempt, or
                    None when it is pending again at once); it will be retried
    job_dead        ``error`` (str); attempts exhausted, failed with dead=True,
                    stalled too often, or failed by a child
    parent_released nothing more; the parent's last child resolved, it is
                    pending now
    flow_failed     ``error`` (str): a parent went dead because a child failed
                    it (``fp``); it also gets ``job_dead``

A receiver that raises is logged at ERROR (logger ``echomq_django.signals``)
and never stops the sender. Nothing is built or read unless a receiver is
connected.
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
job_cancelled = Signal()  # durable only (events.py): sent by the dispatcher for a cancel


def send(signal: Signal, sender, **kwargs) -> None:
    """``signal.send_robust`` that logs every receiver's exception."""
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


def send_outcome(sender, mq, outcome, skip: tuple[str, str] | None = None) -> None:
    """Send ``job_dead``, ``flow_failed`` and ``parent_released`` for what one
    script's ``Outcome`` moved; reads name and error only when someone listens.
    ``skip`` is a ``(queue, id)`` whose own signal the caller sends itself."""
    groups = (
        (job_dead, outcome.dead),
        (flow_failed, outcome.flow_failed),
        (parent_released, outcome.released),
    )
    for signal, pairs in groups:
        if not pairs or not signal.has_listeners(sender):
            continue
        for queue, job_id in pairs:
            if (queue, job_id) == skip and signal is job_dead:
                continue
            try:
                job = mq.get_job(queue, job_id)
            except Exception:
                name, error = "", None
            else:
                name, error = job.name, job.error
            kwargs = {"queue": queue, "job_id": job_id, "job_name": name}
            if signal is not parent_released:
                kwargs["error"] = error
            send(signal, sender, **kwargs)
