"""Orders for the demo: a generated mix (fixed seed) or a CSV file.

Both give request bodies for ``POST /orders/``. The CSV has a header row and
one order per row, with columns:

``customer``  the customer's name
``email``     an email address
``card``      12-19 digits, spaces or dashes allowed (rules.py: ending 0000 is
              declined, 0001-0003 time out 1-3 times first)
``lines``     lines separated by ``;``, each ``SKU`` or ``SKU*QTY``, with a
              trailing ``?`` for an optional line: ``BOOK-1*2; OOS-POSTER?``
              (a sku starting ``OOS-`` is out of stock)
``via``       optional: ``view`` (default; the view adds the flow) or
              ``signal`` (the ``post_save`` receiver does)

``testproject/orders/sample_orders.csv`` is an example.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

SAMPLE_CSV = Path(__file__).with_name("sample_orders.csv")
CSV_COLUMNS = ("customer", "email", "card", "lines", "via")
KINDS = ("clean", "transient", "declined", "optional_oos", "required_oos")
WEIGHTS = (45, 20, 10, 15, 10)  # percent of the random part of a generated mix
IN_STOCK = ("BOOK-1", "MUG-2", "TEE-3", "CAP-4", "PEN-5", "BAG-6", "LAMP-7", "SOCKS-8")
OUT_OF_STOCK = ("OOS-POSTER", "OOS-VINYL", "OOS-KITE")
FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Radia", "Linus", "Frances", "Tim")
LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Thompson", "Perlman", "Allen")


class CsvError(ValueError):
    """The CSV file cannot be read as orders; the message names the row."""


def generate(count: int, seed: int = 7) -> list[dict]:
    """``count`` order bodies. The first five are one of each kind in
    ``KINDS`` (so even a small run shows every path), the rest are drawn with
    ``WEIGHTS``; the same ``seed`` always gives the same orders. About a
    quarter go ``via="signal"``."""
    rng = random.Random(seed)
    orders = []
    for i in range(count):
        kind = KINDS[i] if i < len(KINDS) else rng.choices(KINDS, WEIGHTS)[0]
        first, last = rng.choice(FIRST), rng.choice(LAST)
        last4 = {"transient": f"000{rng.randint(1, 3)}", "declined": "0000"}.get(
            kind, str(rng.randint(1000, 9999))
        )
        lines = [
            {"sku": sku, "qty": rng.randint(1, 3), "optional": rng.random() < 0.2}
            for sku in rng.sample(IN_STOCK, rng.randint(1, 3))
        ]
        if kind in ("optional_oos", "required_oos"):
            lines.insert(
                rng.randint(0, len(lines)),
                {"sku": rng.choice(OUT_OF_STOCK), "qty": 1, "optional": kind == "optional_oos"},
            )
        orders.append(
            {
                "customer": f"{first} {last}",
                "email": f"{first}.{last}.{i}@example.com",
                "card": f"4242 4242 4242 {last4}",
                "lines": lines,
                "via": "signal" if rng.random() < 0.25 else "view",
            }
        )
    return orders


def parse_lines(text: str) -> list[dict]:
    """The ``lines`` column as ``[{sku, qty, optional}]``. A quantity that is
    not a number is passed on as text, for the view to reject by name."""
    lines = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        optional = item.endswith("?")
        sku, _, qty = item.rstrip("?").strip().partition("*")
        qty = qty.strip()
        lines.append(
            {
                "sku": sku.strip(),
                "qty": int(qty) if qty.isdigit() else (qty or 1),
                "optional": optional,
            }
        )
    return lines


def read_csv(path: str | Path) -> list[tuple[int, dict]]:
    """``(row number, order body)`` for each data row of a CSV (the header is
    row 1). Raises ``CsvError`` for a missing file or column; the values
    themselves are checked by the view, which answers 400 naming the field."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS[:4] if c not in (reader.fieldnames or [])]
            if missing:
                raise CsvError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header "
                    f"must name {', '.join(CSV_COLUMNS)} (via is optional)"
                )
            rows = []
            for row in reader:
                body = {name: (row.get(name) or "").strip() for name in CSV_COLUMNS[:3]}
                body["lines"] = parse_lines(row.get("lines") or "")
                body["via"] = (row.get("via") or "").strip() or "view"
                rows.append((reader.line_num, body))
            return rows
    except OSError as err:
        raise CsvError(f"cannot read {path}: {err.strerror}") from None
