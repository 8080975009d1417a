"""Checks the ``POST /orders/`` body; every problem names its field and rule."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

MAX_LINES = 20
MAX_QTY = 99
SKU_RULE = "1-64 characters from A-Z a-z 0-9 _ . -"
_SKU_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_CARD_RE = re.compile(r"[0-9]{12,19}\Z")
FIELDS = {"customer", "email", "card", "lines", "via"}
LINE_FIELDS = {"sku", "qty", "optional"}


def _text(data: dict, name: str, errors: dict, limit: int) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value.strip():
        errors[name] = "required: a non-empty string"
        return ""
    value = value.strip()
    if len(value) > limit:
        errors[name] = f"at most {limit} characters"
    return value


def _lines(value: Any, errors: dict) -> list[dict]:
    if not isinstance(value, list) or not value:
        errors["lines"] = "required: a non-empty list of {sku, qty, optional} objects"
        return []
    if len(value) > MAX_LINES:
        errors["lines"] = f"at most {MAX_LINES} lines"
        return []
    lines = []
    for i, line in enumerate(value):
        where = f"lines[{i}]"
        if not isinstance(line, dict):
            errors[where] = "must be an object {sku, qty, optional}"
            continue
        for name in sorted(set(line) - LINE_FIELDS):
            errors[f"{where}.{name}"] = f"unknown field; allowed: {', '.join(sorted(LINE_FIELDS))}"
        sku, qty, optional = line.get("sku"), line.get("qty", 1), line.get("optional", False)
        if not isinstance(sku, str) or not _SKU_RE.match(sku):
            errors[f"{where}.sku"] = f"required: {SKU_RULE}"
        if not isinstance(qty, int) or isinstance(qty, bool) or not 1 <= qty <= MAX_QTY:
            errors[f"{where}.qty"] = f"must be an integer from 1 to {MAX_QTY}"
        if not isinstance(optional, bool):
            errors[f"{where}.optional"] = "must be true or false"
        lines.append({"sku": sku, "qty": qty, "optional": optional})
    return lines


def clean_order(data: Any) -> tuple[dict, dict[str, str]]:
    """Validate a decoded JSON body.

    Returns ``(order, errors)``: ``order`` is ``{customer, email, card
    (digits only), via ("view" | "signal"), lines: [{sku, qty, optional}]}``
    (meaningful only when there are no errors); ``errors`` maps a field
    (``"email"``, ``"lines[1].qty"``, ``"body"``) to the rule it breaks.
    """
    if not isinstance(data, dict):
        return {}, {"body": "must be a JSON object"}
    errors: dict[str, str] = {}
    for name in sorted(set(data) - FIELDS):
        errors[name] = f"unknown field; allowed: {', '.join(sorted(FIELDS))}"
    order = {
        "customer": _text(data, "customer", errors, 100),
        "email": _text(data, "email", errors, 254),
    }
    if "email" not in errors:
        try:
            validate_email(order["email"])
        except ValidationError:
            errors["email"] = "must be a valid email address"
    card = data.get("card")
    digits = re.sub(r"[ -]", "", card) if isinstance(card, str) else ""
    if not _CARD_RE.match(digits):
        errors["card"] = "required: 12-19 digits (spaces and dashes allowed)"
    order["card"] = digits
    order["via"] = data.get("via", "view")
    if order["via"] not in ("view", "signal"):
        errors["via"] = 'must be "view" or "signal"'
    order["lines"] = _lines(data.get("lines"), errors)
    return order, errors
