from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """Wires the signal receivers (receivers.py); handlers in jobs.py are
    discovered by echomq_django itself. No Redis I/O here."""

    name = "testproject.orders"
    label = "orders"
    verbose_name = "Orders (demo)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connects post_save and flow_failed)
