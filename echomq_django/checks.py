"""System checks for the ``ECHOMQ`` setting
(docs/explanation/house.md#the-root-djangos-conventional-files): stable ids
``echomq_django.E001``... with hints; settings only, no Redis I/O, except
the deployment check ``check_redis_server`` (``check --deploy``), which asks
the server whether it is what they say."""

from __future__ import annotations

from django.core import checks

from .conf import config, problems, server_problems
from .handlers import registered
from .monitoring.metrics import settings_problems
from .runners import periodic as schedule


@checks.register()
def check_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """One ``checks.Error`` per problem ``conf.problems()`` finds."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in problems()]


@checks.register()
def check_scheduling(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The scheduling settings (docs/explanation/protocol.md#scheduling): RATE_LIMIT, TIMEOUT_MS and
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
    """``ECHOMQ["METRICS"]``
    (docs/explanation/house.md#monitoring): ids ``echomq_django.E040``-``E043``."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in settings_problems()]


@checks.register(deploy=True)
def check_redis_server(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The Redis the settings name, against them
    (docs/explanation/reliability.md#bad-input-writes-nothing): ids
    ``echomq_django.E015``-``E017`` (CLUSTER vs the server's type, a DB index
    out of range). A deployment check (``./manage.py check --deploy``): the
    one that connects, with a 1 s timeout, only when the settings themselves
    are sound, silent when Redis is down; a plain ``check`` (and every
    command's own) stays free of Redis I/O. ``runworker`` and ``runpump`` run
    the same comparison at start."""
    if problems():
        return []
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in server_problems()]
