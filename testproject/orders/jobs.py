"""The orders pipeline's handlers, discovered by echomq_django at startup.

Each step behaves as ``rules.py`` says; only ``orders.fulfil`` touches the
database. A child is named by a ``JobRef`` (``ref.queue``, ``ref.id``;
docs/howto/read-flows.md#job-references).
"""

from __future__ import annotations

import echomq_django as emq

from .models import Order
from .rules import CardDeclined, GatewayTimeout, OutOfStock, declined, in_stock, transient_failures


def first_line(text: str) -> str:
    """A job error's summary line (``"ExcType: message"``)."""
    return text.split("\n", 1)[0]


@emq.handler("inventory.reserve")
def reserve(job: emq.Job) -> dict:
    """Reserve ``qty`` of ``sku`` for one line. Payload ``{order, line, sku,
    qty, optional, amount_cents}``; returns ``{line, sku, qty}``. Raises
    ``OutOfStock`` for a sku starting ``OOS-``."""
    p = job.payload
    if not in_stock(p["sku"]):
        raise OutOfStock(f"sku {p['sku']} is out of stock (order {p['order']}, line {p['line']})")
    return {"line": p["line"], "sku": p["sku"], "qty": p["qty"]}


@emq.handler("orders.validate")
def validate(job: emq.Job) -> dict:
    """Runs once every line is reserved or ignored. Payload ``{order, lines}``.
    Returns ``{"reserved": [line numbers], "ignored": [{"line", "sku", "error"}],
    "refund_cents": int}`` (the amount of the ignored optional lines)."""
    lines = {item["line"]: item for item in job.payload["lines"]}
    reserved = sorted(value["line"] for value in job.children_values().values())
    ignored = []
    for ref, error in sorted(job.ignored_failures().items()):
        number = int(ref.id.rsplit("-", 1)[1])
        ignored.append({"line": number, "sku": lines[number]["sku"], "error": first_line(error)})
    return {
        "reserved": reserved,
        "ignored": ignored,
        "refund_cents": sum(lines[item["line"]]["amount_cents"] for item in ignored),
    }


@emq.handler("orders.charge")
def charge(job: emq.Job) -> dict:
    """Charge ``amount_cents`` to ``card``. Payload ``{order, card, amount_cents}``.
    Returns ``{"charged_cents", "card_last4"}``. Raises ``CardDeclined`` (on
    every attempt) or ``GatewayTimeout`` (on the first 1..3 attempts),
    deterministically from the card (rules.py)."""
    p = job.payload
    card = p["card"]
    if declined(card):
        raise CardDeclined(f"card ending {card[-4:]} was declined (order {p['order']})")
    if job.attempts <= transient_failures(card):
        raise GatewayTimeout(
            f"payment gateway timed out (order {p['order']}, attempt {job.attempts})"
        )
    return {"charged_cents": p["amount_cents"], "card_last4": card[-4:]}


@emq.handler("orders.fulfil")
def fulfil(job: emq.Job) -> dict:
    """The flow's parent: runs once validation and the charge are done.

    Reads ``children_values()`` (validate's and charge's results) and
    ``ignored_failures()`` (of its own children: none in this flow, whose
    optional steps sit under validate, which reports them), writes the
    outcome to the ``Order`` row with status ``fulfilled`` and returns it.
    Running it twice writes the same row. Raises ``Order.DoesNotExist``.
    """
    values = {ref.id.split("-", 1)[0]: value for ref, value in job.children_values().items()}
    checked, paid = values["validate"], values["charge"]
    ignored = checked["ignored"] + [
        {"job": ref.id, "error": first_line(error)}
        for ref, error in sorted(job.ignored_failures().items())
    ]
    outcome = {
        "charged_cents": paid["charged_cents"],
        "refunded_cents": checked["refund_cents"],
        "reserved": checked["reserved"],
        "ignored": ignored,
        "card_last4": paid["card_last4"],
    }
    order = Order.objects.get(pk=job.payload["order"])
    order.status, order.outcome = Order.Status.FULFILLED, outcome
    order.save(update_fields=["status", "outcome", "updated"])
    return outcome
