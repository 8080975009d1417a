"""An order's flow: what it looks like and how it is added."""

from __future__ import annotations

import echomq_django as emq

from .models import Order
from .rules import unit_price_cents


def order_flow(order: Order) -> emq.Flow:
    """The flow of a saved ``order`` (its lines are read)::

        orders/order-<pk> orders.fulfil
          validation/validate-<pk> orders.validate
            inventory/reserve-<pk>-<n> inventory.reserve   (one per line)
          payments/charge-<pk> orders.charge

    Every job id is derived from the order, so adding the same order twice
    is a no-op (``add_flow`` skips rows already there). A reserve job of an
    optional line carries ``ignore_dependency_on_failure=True``; every other
    child keeps the default ``fail_parent_on_failure``.
    """
    pk = order.pk
    lines = list(order.lines.all())
    items = [
        {
            "line": ln.number,
            "sku": ln.sku,
            "qty": ln.qty,
            "optional": ln.optional,
            "amount_cents": ln.qty * unit_price_cents(ln.sku),
        }
        for ln in lines
    ]
    reserves = [
        emq.Flow(
            "inventory",
            "inventory.reserve",
            {"order": pk, **item},
            job_id=f"reserve-{pk}-{item['line']}",
            ignore_dependency_on_failure=item["optional"],
        )
        for item in items
    ]
    return emq.Flow(
        "orders",
        "orders.fulfil",
        {"order": pk},
        job_id=order.flow_id,
        children=[
            emq.Flow(
                "validation",
                "orders.validate",
                {"order": pk, "lines": items},
                job_id=f"validate-{pk}",
                children=reserves,
            ),
            emq.Flow(
                "payments",
                "orders.charge",
                {
                    "order": pk,
                    "card": order.card,
                    "amount_cents": sum(item["amount_cents"] for item in items),
                },
                job_id=f"charge-{pk}",
            ),
        ],
    )


def start_flow(order: Order) -> emq.FlowRef:
    """Add ``order``'s flow once the current transaction commits (at once
    when none is open). Returns the ``FlowRef``; its ids are known before the
    commit. Errors from Redis surface at commit time (``RedisUnavailable``)."""
    return emq.add_flow(order_flow(order), on_commit=True)
