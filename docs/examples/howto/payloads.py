"""Dates, Decimal and UUID in payloads (docs/howto/payloads.md)."""

import datetime
import decimal
import uuid

import echomq_django as emq

# settings.py
ECHOMQ = {
    "URL": "redis://127.0.0.1:6379/0",
    "JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder",
}


def bill(invoice_uuid, amount, due):
    """``amount`` a Decimal, ``due`` a date, ``invoice_uuid`` a UUID."""
    return emq.enqueue(
        "billing", "billing.charge", {"invoice": invoice_uuid, "amount": amount, "due": due}
    )


@emq.handler("billing.charge")
def charge(job):
    """The payload comes back as JSON: strings. Turn them back yourself."""
    invoice = uuid.UUID(job.payload["invoice"])
    amount = decimal.Decimal(job.payload["amount"])
    due = datetime.date.fromisoformat(job.payload["due"])
    return {"invoice": invoice, "cents": int(amount * 100), "late": due < datetime.date.today()}
