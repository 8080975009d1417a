"""System checks for the ``ECHOMQ`` setting
(docs/explanation/house.md#the-root-djangos-conventional-files): stable ids
``echomq_django.E001``... with hints; settings only, no Redis I/O, except
the deployment check ``check_redis_server`` (``check --deploy``), which asks
the server whether it is what they say."""

from __future__ import annotations

import difflib

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
    """The periodic jobs' settings (docs/explanation/protocol.md#scheduling): SCHEDULE, ids
    ``echomq_django.E052``-``E058`` (``schedule.schedule_problems``); a queue's RATE_LIMIT and
    TIMEOUT_MS (E050, E051, E059) are ``check_settings``'s, as ``get_mq()`` refuses them."""
    try:
        cfg = config()
    except Exception:
        return []  # check_settings reports a malformed ECHOMQ
    found = [
        checks.Error(msg, hint=hint, id=cid)
        for cid, msg, hint in schedule.schedule_problems(cfg, handlers=registered())
    ]
    return found + _old_croniter(cfg.get("SCHEDULE"), found)


CRONITER_FLOOR = (6, 1)  # earlier releases put a time in a DST gap at the old offset


def _old_croniter(entries, found: list) -> list[checks.CheckMessage]:
    """E057 once when a SCHEDULE entry uses 'cron' and the installed
    croniter is older than ``CRONITER_FLOOR`` (docs/howto/periodic.md)."""
    from importlib.metadata import PackageNotFoundError, version

    uses_cron = isinstance(entries, dict) and any(
        isinstance(spec, dict) and "cron" in spec for spec in entries.values()
    )
    if not uses_cron or any(e.id == "echomq_django.E057" for e in found):
        return []
    try:
        text = version("croniter")
    except PackageNotFoundError:
        return []
    numbers = tuple(int(p) if p.isdigit() else 0 for p in text.split(".")[:2])
    if numbers >= CRONITER_FLOOR:
        return []
    floor = ".".join(map(str, CRONITER_FLOOR))
    return [
        checks.Error(
            f"SCHEDULE uses 'cron' but croniter {text} is installed, older than {floor}: "
            "its times on daylight-saving nights are off by the gap",
            hint=f"pip install 'croniter>={floor}' (BullMQ's Python client pins croniter "
            "2.0.7: keep it in another environment).",
            id="echomq_django.E057",
        )
    ]


@checks.register()
def check_metrics_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``ECHOMQ["METRICS"]``
    (docs/explanation/house.md#monitoring): ids ``echomq_django.E040``-``E043``."""
    if not isinstance(getattr(settings, "ECHOMQ", {}), dict):
        return []  # check_settings says so: E026
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in settings_problems()]


BACKEND_PREFIX = "echomq_django.tasks."


@checks.register()
def check_tasks_framework(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``echomq_django.E034``: a ``TASKS`` entry names this app's backend
    (``echomq_django.tasks.EchoMQBackend``) but no tasks framework is
    importable (Django 5.2 without the django-tasks backport): Django 5.2
    ignores ``TASKS``, so nothing would load the backend, and a worker would
    kill every ``@task`` job it meets for want of a handler. No Redis I/O.
    docs/howto/tasks-backend.md"""
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
    """The Redis the settings name, against them
    (docs/explanation/reliability.md#bad-input-writes-nothing): ids
    ``echomq_django.E015``-``E017`` and ``E024`` (CLUSTER vs the server's
    type, a DB index out of range, refused credentials), and the warning
    ``W018`` (a server that evicts keys). A deployment check
    (``./manage.py check --deploy``): the one that connects, with a 1 s
    timeout, only when the settings themselves are sound, silent when Redis
    is down; a plain ``check`` (and every command's own) stays free of Redis
    I/O. ``runworker`` and ``runpump`` run the same comparison at start."""
    if problems():
        return []
    return [
        (checks.Warning if ".W" in cid else checks.Error)(msg, hint=hint, id=cid)
        for cid, msg, hint in server_problems()
    ]


TASKS_BACKEND = "echomq_django.tasks.EchoMQBackend"


def _names(value) -> list[str]:
    return [
        q for q in (value if isinstance(value, list | tuple | dict) else []) if isinstance(q, str)
    ]


@checks.register()
def check_queue_names(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Queues the settings use that look unknown (docs/reference/checks.md#queue-names): a job
    added to a queue no worker serves waits forever, silently. Warnings,
    settings only:

    * ``echomq_django.W090``: a ``SCHEDULE`` entry's queue that neither
      ``ECHOMQ["QUEUES"]`` nor the ``QUEUES`` of a ``TASKS`` backend of
      ours names (when they name any queue at all);
    * ``echomq_django.W091``: a ``TASKS`` backend's queue that
      ``ECHOMQ["QUEUES"]`` does not name but nearly does ("defualt" beside
      "default": a typo, most likely).
    """
    try:
        cfg = config()
    except Exception:
        return []  # check_settings reports a malformed ECHOMQ
    if problems(cfg):
        return []  # check_settings reports them first
    configured = _names(cfg.get("QUEUES"))
    routed: dict[str, list[str]] = {}
    tasks = getattr(settings, "TASKS", {})
    for alias, entry in tasks.items() if isinstance(tasks, dict) else ():
        if isinstance(entry, dict) and entry.get("BACKEND") == TASKS_BACKEND:
            routed[alias] = _names(entry.get("QUEUES"))
    named = set(configured).union(*routed.values())
    out = []
    schedule = cfg.get("SCHEDULE", {})
    if schedule and schedule_problems(cfg):
        schedule = {}  # check_scheduling reports it first (E052-E058)
    for key, spec in schedule.items() if isinstance(schedule, dict) and named else ():
        queue = spec.get("queue") if isinstance(spec, dict) else None
        if isinstance(queue, str) and queue not in named:
            out.append(
                checks.Warning(
                    f"SCHEDULE entry {key!r} adds its jobs to queue {queue!r}, which neither "
                    f"ECHOMQ['QUEUES'] nor TASKS names{_close(queue, named)}",
                    hint="Run a worker on that queue (runworker QUEUE), or fix the name; "
                    "naming it in ECHOMQ['QUEUES'] silences this.",
                    id="echomq_django.W090",
                )
            )
    for alias, queues in routed.items():
        for queue in queues:
            close = _close(queue, [q for q in configured if q != queue])
            if queue not in configured and close:
                out.append(
                    checks.Warning(
                        f"TASKS[{alias!r}] routes tasks to queue {queue!r}, which "
                        f"ECHOMQ['QUEUES'] does not name{close}",
                        hint="Fix the name in TASKS QUEUES (and the tasks' queue_name), or "
                        "name the queue in ECHOMQ['QUEUES'].",
                        id="echomq_django.W091",
                    )
                )
    return out


def _close(queue: str, names) -> str:
    """``: did you mean 'x'?`` for the nearest of ``names``, or ``""``."""
    found = difflib.get_close_matches(queue, sorted(names), n=1, cutoff=0.8)
    return f": did you mean {found[0]!r}?" if found else ""


def schedule_problems(cfg: dict) -> list:
    """``schedule.schedule_problems`` of ``cfg`` (the SCHEDULE errors)."""
    return schedule.schedule_problems(cfg, handlers=registered())
