"""Signal receivers, connected by ``OrdersConfig.ready()``.

* ``post_save`` of an ``Order`` created with ``via="signal"``: the other way
  to start a flow. Its lines are saved after the order, so the receiver
  builds the flow when the transaction commits, from what was committed.
* ``echomq_django.signals.flow_failed``: a durable signal, sent at least
  once by the pump's dispatcher when an ``orders.fulfil`` parent died
  because a child failed it (a declined card, a required line out of
  stock); marks the order failed with the reason, idempotently by the
  signal's ``event_id``.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from echomq_django.signals import flow_failed

from .flows import start_flow
from .jobs import first_line
from .models import Order

FAILED_BY_CHILD = "failed by child "
log = logging.getLogger("orders.receivers")


@receiver(post_save, sender=Order, dispatch_uid="orders.start_flow_after_save")
def start_flow_after_save(
    sender, instance: Order, created: bool, raw: bool = False, **kwargs
) -> None:
    """Start the flow of an order created with ``via="signal"`` once its
    transaction commits (at once outside one). Fixture loads (``raw``) and
    updates start nothing."""
    if raw or not created or instance.via != Order.Via.SIGNAL:
        return
    pk, using = instance.pk, kwargs.get("using")
    transaction.on_commit(lambda: start_flow(Order.objects.using(using).get(pk=pk)), using=using)


def failed_job(error: str) -> str:
    """The job at the bottom of a ``failed by child <queue/id>: ...`` chain,
    as ``queue/id`` ("" when the error names no child)."""
    ref = ""
    line = first_line(error or "")
    while line.startswith(FAILED_BY_CHILD):
        ref, _, line = line[len(FAILED_BY_CHILD) :].partition(": ")
    return ref


@receiver(flow_failed, dispatch_uid="orders.mark_order_failed")
def mark_order_failed(
    sender,
    queue: str,
    job_id: str,
    job_name: str,
    error: str | None = None,
    event_id: str | None = None,
    **kwargs,
) -> None:
    """Mark the order of a dead ``orders.fulfil`` parent failed, with
    ``outcome = {"reason": <the parent's error, first line>, "failed_job":
    "queue/id" of the job that started it, "event_id": the signal's}``. Other
    parents are ignored.

    Idempotent, as a receiver of a durable signal must be (the dispatcher
    sends at least once: after a crash the same event comes again, with the
    same ``event_id``): the status and the ``event_id`` that set it are
    written in one transaction, so a repeat finds its ``event_id`` recorded
    and changes nothing; an order already decided is left alone too."""
    if queue != "orders" or not job_id.startswith("order-"):
        return
    pk = int(job_id[len("order-") :])
    with transaction.atomic():
        order = Order.objects.select_for_update().filter(pk=pk).first()
        if order is None:
            return
        if event_id and (order.outcome or {}).get("event_id") == event_id:
            log.info("flow_failed %s for order %s again: applied already", event_id, pk)
            return
        if order.status != Order.Status.PENDING:
            return
        order.status = Order.Status.FAILED
        order.outcome = {
            "reason": first_line(error or "failed by a child"),
            "failed_job": failed_job(error or ""),
            "event_id": event_id,
        }
        order.save(update_fields=["status", "outcome", "updated"])
