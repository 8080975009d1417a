"""The orders JSON API (urls.py mounts it under ``/orders/``).

``POST /orders/``      create an order; its flow is added when the transaction commits
``GET  /orders/``      the latest 50 orders, newest first
``GET  /orders/<id>/`` one order with its lines, predicted outcome and the
                       flow's live state read from Redis

A JSON API for scripts rather than browsers, so CSRF does not apply
(``csrf_exempt``); a real shop would authenticate its callers.
"""

from __future__ import annotations

import json

import redis
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

import echomq_django as emq

from .flows import start_flow
from .models import Order, OrderLine
from .rules import predict
from .validation import clean_order

LIST_LIMIT = 50


def order_json(order: Order) -> dict:
    """An order as JSON: fields, lines, ``predicted`` (``rules.predict``) and
    ``flow`` (the root job's queue and id). The card is shown as its last four
    digits only."""
    lines = list(order.lines.all())
    return {
        "id": order.pk,
        "customer": order.customer,
        "email": order.email,
        "card_last4": order.card[-4:],
        "status": order.status,
        "via": order.via,
        "outcome": order.outcome,
        "created": order.created.isoformat(),
        "updated": order.updated.isoformat(),
        "lines": [
            {"number": ln.number, "sku": ln.sku, "qty": ln.qty, "optional": ln.optional}
            for ln in lines
        ],
        "predicted": predict(order),
        "flow": {"queue": "orders", "job_id": order.flow_id, "jobs": len(lines) + 3},
        "url": f"/orders/{order.pk}/",
    }


@csrf_exempt
@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> JsonResponse:
    """``POST``: create an order from a JSON body ``{customer, email, card,
    lines: [{sku, qty (1-99, default 1), optional (default false)}], via
    ("view" default, or "signal")}``.

    201 with the order (status ``pending``); 400 ``{"errors": {field: rule}}``
    for a body that breaks a rule (nothing saved, nothing in Redis); 503 when
    the order was saved but Redis refused its flow. The order and its lines
    are saved in one transaction and the flow is added on commit: by this
    view (``via="view"``) or by the ``post_save`` receiver (``via="signal"``).
    ``GET``: ``{"orders": [...]}``, the latest 50.
    """
    if request.method == "GET":
        latest = Order.objects.prefetch_related("lines")[:LIST_LIMIT]
        return JsonResponse({"orders": [order_json(o) for o in latest]})
    try:
        data = json.loads(request.body or b"null")
    except ValueError as err:
        return JsonResponse({"errors": {"body": f"must be valid JSON ({err})"}}, status=400)
    cleaned, errors = clean_order(data)
    if errors:
        return JsonResponse({"errors": errors}, status=400)
    try:
        with transaction.atomic():
            order = Order.objects.create(
                customer=cleaned["customer"],
                email=cleaned["email"],
                card=cleaned["card"],
                via=cleaned["via"],
            )
            OrderLine.objects.bulk_create(
                OrderLine(order=order, number=n, **line)
                for n, line in enumerate(cleaned["lines"], start=1)
            )
            if order.via == Order.Via.VIEW:
                start_flow(order)  # lands when the block commits
    except (emq.EchoMQError, redis.RedisError) as err:
        return JsonResponse(
            {
                "errors": {
                    "flow": f"order {order.pk} was saved but its flow could not be added: {err}"
                }
            },
            status=503,
        )
    return JsonResponse(order_json(order), status=201)


def as_json(node: dict) -> dict:
    """A ``get_flow`` tree with each node's ``ref`` (a ``JobRef``) as its
    ``"queue/id"`` text, for JSON."""
    return {
        **node,
        "ref": str(node["ref"]),
        "children": [as_json(child) for child in node["children"]],
    }


@require_GET
def order_detail(request: HttpRequest, pk: int) -> JsonResponse:
    """One order as ``order_json`` plus ``flow.state``: the tree of its
    flow's jobs as ``echomq_django.get_flow`` reads it (``null`` before the
    flow has landed, an ``error`` string when Redis is unreachable). 404
    ``{"errors": {"id": ...}}`` for an unknown id."""
    try:
        order = Order.objects.prefetch_related("lines").get(pk=pk)
    except Order.DoesNotExist:
        return JsonResponse({"errors": {"id": f"no order {pk}"}}, status=404)
    body = order_json(order)
    try:
        body["flow"]["state"] = as_json(emq.get_flow("orders", order.flow_id))
    except emq.JobNotFound:
        body["flow"]["state"] = None
    except (emq.EchoMQError, redis.RedisError) as err:
        body["flow"]["state"], body["flow"]["error"] = None, f"Redis: {err}"
    return JsonResponse(body)
