"""The Django app. ``ready()`` registers checks and discovers ``jobs`` modules;
it never touches Redis."""

from importlib.util import find_spec

from django.apps import AppConfig


def tasks_framework() -> str | None:
    """``"django.tasks"`` (Django 6), ``"django_tasks"`` (the backport) or None."""
    for name in ("django.tasks", "django_tasks"):
        try:
            if find_spec(name) is not None:
                return name
        except ImportError:  # the parent package is missing
            continue
    return None


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
