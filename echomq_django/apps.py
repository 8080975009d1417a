"""The Django app. ``ready()`` registers checks and discovers ``jobs`` modules;
it never touches Redis."""

from django.apps import AppConfig

from .handlers import tasks_framework


class EchoMQConfig(AppConfig):
    name = "echomq_django"
    verbose_name = "EchoMQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import autodiscover

        if tasks_framework():
            from . import tasks  # noqa: F401  (registers the handler of task jobs)
        autodiscover()
