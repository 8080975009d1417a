"""System checks for the ``ECHOMQ`` setting (DESIGN §8): stable ids
``echomq_django.E001``... with hints, settings only, no Redis I/O."""

from __future__ import annotations

from django.core import checks

from .conf import problems
from .metrics import settings_problems


@checks.register()
def check_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """One ``checks.Error`` per problem ``conf.problems()`` finds."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in problems()]


@checks.register()
def check_metrics_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``ECHOMQ["METRICS"]`` (DESIGN §10.5): ids ``echomq_django.E040``-``E043``."""
    return [checks.Error(msg, hint=hint, id=cid) for cid, msg, hint in settings_problems()]
