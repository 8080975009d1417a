"""How the admin's lists show a job or a queue (DESIGN §8, §10.5): coloured
state badges, the error's first line, waited/ran durations, booleans that
read the right way, counts that link to the filtered job list, and the
list filters that go with them. Pure functions of a mirrored row; the
HTML comes from ``format_html`` (every value escaped).
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from ..conf import get_mq
from ..core.exceptions import EchoMQError
from ..models import MirroredJob, MirroredQueue
from ..monitoring.stats import duration
from ..monitoring.stats import no_worker_for_s as _no_worker_for_s
from ..templatetags.echomq_admin import emq_flag, emq_headline, emq_policy, emq_state

ERROR_CHARS = 80  # an error's first line in the job list


@admin.display(description="state", ordering="state")
def state_badge(obj: MirroredJob) -> str:
    """The state's badge; a row gone from Redis says so beside it."""
    badge = emq_state(obj.state, short=True)
    if obj.gone_from_redis:
        return format_html('{} <span class="emq-flag-yes">gone from Redis</span>', badge)
    return badge


@admin.display(description="tries", ordering="attempts")
def attempts(obj: MirroredJob) -> str:
    return f"{obj.attempts} of {obj.max_attempts}"


@admin.display(description="error")
def error_preview(obj: MirroredJob) -> str:
    """The error's first line (``ExcType: message``), cut at ``ERROR_CHARS``."""
    line = emq_headline(obj.error)
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"


@admin.display(description="waited · ran")
def times(obj: MirroredJob) -> str:
    """How long it queued before its last start, and how long that ran."""
    return f"{waited(obj)} · {ran(obj)}"


def waited(obj: MirroredJob) -> str:
    """From creation to its last start (how long it queued), in words."""
    if obj.created_at is None or obj.started_at is None or obj.started_at < obj.created_at:
        return "-"
    return duration((obj.started_at - obj.created_at).total_seconds())


def ran(obj: MirroredJob) -> str:
    """From its last start to its finish, in words."""
    if obj.started_at is None or obj.finished_at is None or obj.finished_at < obj.started_at:
        return "-"
    return duration((obj.finished_at - obj.started_at).total_seconds())


@admin.display(description="in Redis", ordering="gone_from_redis")
def in_redis(obj: MirroredJob) -> str:
    return emq_flag(obj.gone_from_redis, "gone from Redis,in Redis")


@admin.display(description="payload, result and error in this row")
def trimmed(obj: MirroredJob) -> str:
    return emq_flag(obj.truncated, "trimmed here (the live values below are whole),whole")


@admin.display(description="if it dies")
def policy(obj: MirroredJob) -> str:
    return emq_policy(obj.parent_policy or ("fp" if obj.parent_id else ""))


def jobs_url(queue: str, state: str | None = None) -> str:
    """The job list filtered to ``queue`` (and ``state``)."""
    url = f"{reverse('admin:echomq_django_mirroredjob_changelist')}?queue={queue}"
    return f"{url}&state__exact={state}" if state else url


def count_link(queue: str, state: str, n: int) -> str:
    """A count that opens the job list filtered to its queue and state."""
    return format_html(
        '<a class="emq-count-link" href="{}" title="list them">{}</a>', jobs_url(queue, state), n
    )


STATES = ("pending", "active", "delayed", "awaiting_children", "completed", "dead")


def _count_column(state: str):
    def column(obj: MirroredQueue) -> str:
        return count_link(obj.queue, state, getattr(obj, state))

    column.__name__ = f"{state}_count"
    return admin.display(description=state.replace("_", " "), ordering=state)(column)


COUNT_COLUMNS = {state: _count_column(state) for state in STATES}


@admin.display(description="oldest pending", ordering="oldest_pending_age_s")
def oldest_pending(obj: MirroredQueue) -> str:
    return duration(obj.oldest_pending_age_s)


@admin.display(description="paused")
def paused(obj: MirroredQueue) -> str:
    """Read live from Redis (one EXISTS); ``?`` when Redis did not answer."""
    try:
        return emq_flag(get_mq().is_paused(obj.queue), "paused,no")
    except EchoMQError:
        return "?"


@admin.display(description="no worker for")
def no_worker(obj: MirroredQueue) -> str:
    """Read live from Redis (the live processes, one HMGET of
    ``P:served``): ``no worker for N s`` when no live worker serves the
    queue (counted from its last worker, or its first job; see
    docs/operating.md#echomq_stats), ``-`` when one does or it is not
    known since when, ``?`` when Redis did not answer."""
    try:
        mq = get_mq()
        now = mq.clock()
        procs = mq.presence.live_processes(now)
        since = mq.presence.no_worker_since([obj.queue])
    except EchoMQError:
        return "?"
    seconds = _no_worker_for_s(obj.queue, procs, since, now)
    if seconds is None:
        return "-"
    return format_html('<span class="emq-flag-yes">no worker for {}</span>', duration(seconds))


class HasErrorFilter(admin.SimpleListFilter):
    """Jobs with an error (a failed attempt, or dead) or without one."""

    title = "error"
    parameter_name = "error"

    def lookups(self, request, model_admin):
        return (("yes", "with an error"), ("no", "without"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.exclude(error="")
        if self.value() == "no":
            return queryset.filter(error="")
        return queryset


class InRedisFilter(admin.SimpleListFilter):
    """Rows still in Redis, or gone from it (retention, a flush)."""

    title = "in Redis"
    parameter_name = "gone"

    def lookups(self, request, model_admin):
        return (("no", "in Redis"), ("yes", "gone from Redis"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(gone_from_redis=self.value() == "yes")
        return queryset
