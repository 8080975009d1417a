"""The demo's business rules, deterministic from an order's data.

Nothing here is random, so the same order always takes the same path through
its flow and ``predict`` can say how it ends before it runs.

Cards (12-19 digits), by their last four digits:

* ``0000`` — declined: every charge attempt raises ``CardDeclined``, so the
  ``orders.charge`` job dies once the ``payments`` queue's ``MAX_ATTEMPTS``
  are spent, and (default policy ``fail_parent``) the order fails;
* ``0001``, ``0002``, ``0003`` — the gateway times out on the first 1, 2 or 3
  attempts (``GatewayTimeout``), then the charge goes through: retries with
  backoff (it would die too if ``MAX_ATTEMPTS`` were not above that count);
* anything else — charged on the first attempt.

SKUs: one starting ``OOS-`` is out of stock: every ``inventory.reserve``
attempt raises ``OutOfStock`` and the job dies after the ``inventory`` queue's
``MAX_ATTEMPTS``. On an optional line that failure is ignored
(``ignore_dependency_on_failure``: the order ships without it and the amount
of the line is refunded); on a required line it fails ``orders.validate`` and
so the order.

Prices: a sku's unit price is ``100 + crc32(sku) % 9900`` cents.
"""

from __future__ import annotations

import zlib
from typing import Any

DECLINED = "0000"
TRANSIENT = {"0001": 1, "0002": 2, "0003": 3}  # last four digits -> failing attempts
OUT_OF_STOCK_PREFIX = "OOS-"


class CardDeclined(Exception):
    """The issuer refused the card; retrying does not help."""


class GatewayTimeout(Exception):
    """The payment gateway did not answer this time; a retry may work."""


class OutOfStock(Exception):
    """No stock for the sku; retrying does not help."""


def unit_price_cents(sku: str) -> int:
    """The catalogue price of one ``sku``, in cents (100..9999)."""
    return 100 + zlib.crc32(sku.encode()) % 9900


def in_stock(sku: str) -> bool:
    """False for a sku starting ``OOS-``."""
    return not sku.startswith(OUT_OF_STOCK_PREFIX)


def declined(card: str) -> bool:
    """True when the card's last four digits are ``0000``."""
    return card.endswith(DECLINED)


def transient_failures(card: str) -> int:
    """How many charge attempts time out before one succeeds (0..3)."""
    return TRANSIENT.get(card[-4:], 0)


def attempts_allowed(queue: str) -> int:
    """The queue's ``MAX_ATTEMPTS`` as the worker applies it (settings, else
    echomq_django's default). Builds no Redis connection."""
    from django.conf import settings

    from echomq_django.core.jobs import QUEUE_DEFAULTS

    opts = getattr(settings, "ECHOMQ", {}).get("QUEUES", {}).get(queue) or {}
    return int(opts.get("MAX_ATTEMPTS", QUEUE_DEFAULTS["MAX_ATTEMPTS"]))


def _card_and_lines(order: Any) -> tuple[str, list[tuple[str, int, bool]]]:
    if isinstance(order, dict):
        return (
            str(order["card"]),
            [
                (ln["sku"], int(ln.get("qty", 1)), bool(ln.get("optional", False)))
                for ln in order["lines"]
            ],
        )
    return order.card, [(ln.sku, ln.qty, ln.optional) for ln in order.lines.all()]


def predict(order: Any) -> dict:
    """How ``order``'s flow ends, from its data alone.

    ``order``: an ``Order`` (its lines are read) or a dict shaped like the
    ``POST /orders/`` body (``card``, ``lines: [{sku, qty, optional}]``).
    Returns ``{"status": "fulfilled" | "failed", "ignored": int, "retries": int}``:
    ``ignored`` counts the failures listed in a fulfilled order's outcome
    (its out-of-stock optional lines; 0 for a failed order, whose outcome is
    the reason), ``retries`` the sum over the flow's jobs of ``attempts - 1``
    (a dead out-of-stock reserve and a declined charge spend every attempt;
    parents never fail on their own).
    """
    card, lines = _card_and_lines(order)
    reserve_max, charge_max = attempts_allowed("inventory"), attempts_allowed("payments")
    retries = sum(reserve_max - 1 for sku, _, _ in lines if not in_stock(sku))
    failing = charge_max if declined(card) else min(transient_failures(card), charge_max)
    charge_dies = failing >= charge_max
    retries += charge_max - 1 if charge_dies else failing
    required_missing = any(not in_stock(sku) and not opt for sku, _, opt in lines)
    if charge_dies or required_missing:
        return {"status": "failed", "ignored": 0, "retries": retries}
    ignored = sum(1 for sku, _, opt in lines if opt and not in_stock(sku))
    return {"status": "fulfilled", "ignored": ignored, "retries": retries}
