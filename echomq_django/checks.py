"""System checks for the ``ECHOMQ`` setting (DESIGN §8): stable ids
``echomq_django.E001``... with hints, settings only, no Redis I/O."""

from __future__ import annotations

from django.core import checks

from . import schedule
from .conf import config, problems
from .handlers import registered


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
    from .metrics import settings_problems

    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in settings_problems()]
