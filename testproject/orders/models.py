"""An order and its lines. The flow's ids are derived from them (``job_ids``)."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """One customer order.

    ``status`` starts ``pending``; the ``orders.fulfil`` handler sets
    ``fulfilled`` and the ``flow_failed`` receiver ``failed``. ``outcome`` is
    what they wrote: for a fulfilled order ``{"charged_cents", "refunded_cents",
    "reserved": [line numbers], "ignored": [{"line", "sku", "error"}], "card_last4"}``,
    for a failed one ``{"reason": str, "failed_job": "queue/id", "event_id":
    the flow_failed signal's}``. ``via`` says
    who added the flow: the view (``view``) or the ``post_save`` receiver
    (``signal``). ``card`` holds the digits of a demo card number.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        FULFILLED = "fulfilled"
        FAILED = "failed"

    class Via(models.TextChoices):
        VIEW = "view"
        SIGNAL = "signal"

    customer = models.CharField(max_length=100)
    email = models.EmailField()
    card = models.CharField(max_length=19, help_text="digits only (a demo card number)")
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    via = models.CharField(max_length=6, choices=Via.choices, default=Via.VIEW)
    outcome = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"order #{self.pk} ({self.status})"

    @property
    def flow_id(self) -> str:
        """The id of the flow's root job on queue ``orders``: ``order-<pk>``."""
        return f"order-{self.pk}"

    def job_ids(self) -> list[tuple[str, str]]:
        """Every job of the order's flow as ``(queue, id)``, root first."""
        pk = self.pk
        return [
            ("orders", f"order-{pk}"),
            ("validation", f"validate-{pk}"),
            ("payments", f"charge-{pk}"),
            *(("inventory", f"reserve-{pk}-{line.number}") for line in self.lines.all()),
        ]


class OrderLine(models.Model):
    """One line: ``qty`` of ``sku``. ``number`` is its 1-based position in the
    order (job id ``reserve-<order pk>-<number>``). An ``optional`` line may be
    dropped when out of stock without failing the order."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    number = models.PositiveSmallIntegerField()
    sku = models.CharField(max_length=64)
    qty = models.PositiveSmallIntegerField()
    optional = models.BooleanField(default=False)

    class Meta:
        ordering = ("order", "number")
        constraints = (
            models.UniqueConstraint(fields=["order", "number"], name="orders_line_number_unique"),
        )

    def __str__(self) -> str:
        return f"{self.qty} x {self.sku}" + (" (optional)" if self.optional else "")
