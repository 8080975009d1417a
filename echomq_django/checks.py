"""System checks for the ``ECHOMQ`` setting (DESIGN §8): stable ids
``echomq_django.E001``... with hints; settings only, no Redis I/O, except
the deployment check ``check_redis_server`` (``check --deploy``), which asks
the server whether it is what they say."""

from __future__ import annotations

from django.conf import settings
from django.core import checks

from .conf import config, problems, server_problems
from .handlers import registered, tasks_framework
from .monitoring.metrics import settings_problems
from .runners import periodic as schedule


@checks.register()
def check_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """One ``checks.Error`` per problem ``conf.problems()`` finds."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in problems()]


@checks.register()
def check_scheduling(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The scheduling settings (DESIGN §10.3): RATE_LIMIT, TIMEOUT_MS and
    SCHEDULE, ids ``echomq_django.E050``-``E058`` (``schedule.problems``)."""
    try:
        cfg = config()
    except Exception:
        return []  # check_settings reports a malformed ECHOMQ
    return [
        checks.Error(msg, hint=hint, id=cid)
        for cid, msg, hint in schedule.problems(cfg, handlers=registered())
    ]


@checks.register()
def check_metrics_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``ECHOMQ["METRICS"]`` (DESIGN §10.5): ids ``echomq_django.E040``-``E043``."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in settings_problems()]


BACKEND_PREFIX = "echomq_django.tasks."


@checks.register()
def check_tasks_framework(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``echomq_django.E034``: a ``TASKS`` entry names this app's backend
    (``echomq_django.tasks.EchoMQBackend``) but no tasks framework is
    importable (Django 5.2 without the django-tasks backport): Django 5.2
    ignores ``TASKS``, so nothing would load the backend, and a worker would
    kill every ``@task`` job it meets for want of a handler. No Redis I/O.
    docs/use.md#djangos-tasks-framework-echomq_djangotasksechomqbackend"""
    entries = getattr(settings, "TASKS", None)
    if not isinstance(entries, dict) or tasks_framework() is not None:
        return []
    return [
        checks.Error(
            f"TASKS[{alias!r}] names {entry['BACKEND']!r}, but no tasks framework is "
            "importable: Django 5.2 has no django.tasks and the django-tasks backport is "
            "not installed, so this backend cannot serve it",
            hint="pip install django-tasks (or move to Django 6), then restart the "
            "workers: one started without it has no handler for task jobs",
            id="echomq_django.E034",
        )
        for alias, entry in entries.items()
        if isinstance(entry, dict) and str(entry.get("BACKEND", "")).startswith(BACKEND_PREFIX)
    ]


@checks.register(deploy=True)
def check_redis_server(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The Redis the settings name, against them (issue 17, item 7): ids
    ``echomq_django.E015``-``E017`` (CLUSTER vs the server's type, a DB index
    out of range). A deployment check (``./manage.py check --deploy``): the
    one that connects, with a 1 s timeout, only when the settings themselves
    are sound, silent when Redis is down; a plain ``check`` (and every
    command's own) stays free of Redis I/O. ``runworker`` and ``runpump`` run
    the same comparison at start."""
    if problems():
        return []
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in server_problems()]
