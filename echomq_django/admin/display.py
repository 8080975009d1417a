"""How the admin's lists show a job or a queue
(docs/howto/operate.md#what-the-admins-pages-show): coloured state badges with
the attempts under them, the error's first line, waited/ran durations,
booleans that read the right way, counts that link to the filtered job list,
and the list filters that go with them. Pure functions of a mirrored row;
the HTML comes from ``format_html`` (every value escaped). Long ids, queue
and job names carry line-break opportunities (``emq_breakable``) so the
lists fit a 1280 px screen with both sidebars open.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from ..conf import get_mq
from ..core.exceptions import EchoMQError
from ..models import TEXT_LIMIT, MirroredJob, MirroredQueue
from ..monitoring.stats import duration
from ..monitoring.stats import no_worker_for_s as _no_worker_for_s
from ..templatetags.echomq_admin import (
    emq_breakable,
    emq_flag,
    emq_headline,
    emq_progress,
    emq_state,
)

ERROR_CHARS = 80  # an error's first line in the job list


def job_cell(change_url: str, obj: MirroredJob) -> str:
    """The job list's first cell: the id (a link to ``change_url``, its
    page), and under it, quiet, its queue and job name."""
    return format_html(
        '<a href="{}" class="emq-job-id">{}</a><span class="emq-sub">{} · {}</span>',
        change_url,
        emq_breakable(obj.job_id),
        emq_breakable(obj.queue),
        emq_breakable(obj.name),
    )


@admin.display(description="state", ordering="state")
def state_badge(obj: MirroredJob) -> str:
    """The state's badge, its attempts under it (``attempts_text``); a row
    gone from Redis says so beside it."""
    badge = emq_state(obj.state, short=True)
    if obj.gone_from_redis:
        badge = format_html('{} <span class="emq-flag-yes">gone from Redis</span>', badge)
    return format_html('{}<span class="emq-sub emq-attempts">{}</span>', badge, attempts_text(obj))


def attempts_text(job) -> str:
    """``"1 of 3 attempts"`` for a ``Job`` or a mirrored row."""
    return f"{job.attempts} of {job.max_attempts} attempts"


@admin.display(description="error")
def error_preview(obj: MirroredJob) -> str:
    """The error's first line (``ExcType: message``), cut at ``ERROR_CHARS``;
    the whole line is its title. It wraps anywhere (a URL has no spaces)."""
    line = emq_headline(obj.error)
    if not line:
        return ""
    cut = line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"
    return format_html('<span class="emq-error-line" title="{}">{}</span>', line, cut)


@admin.display(description="progress")
def progress_cell(obj: MirroredJob) -> str:
    """The last progress its handler reported, in words (``emq_progress``):
    ``40%``, or an object's JSON cut short with the whole as its title; ``-``
    for none."""
    words = emq_progress(obj.progress, short=True)
    if not words:
        return "-"
    return format_html('<span title="{}">{}</span>', emq_progress(obj.progress), words)


@admin.display(description="waited · ran")
def times(obj: MirroredJob) -> str:
    """How long it queued before its last start, and how long that ran; each
    duration stays on one line, the pair may wrap at the dot; ``-`` for a job
    that never started."""
    if obj.started_at is None:
        return "-"
    return f"{waited(obj)} · {ran(obj)}"


def waited(obj: MirroredJob) -> str:
    """From creation to its last start (how long it queued), in words kept on
    one line (no-break spaces)."""
    if obj.created_at is None or obj.started_at is None or obj.started_at < obj.created_at:
        return "-"
    return _one_line(duration((obj.started_at - obj.created_at).total_seconds()))


def ran(obj: MirroredJob) -> str:
    """From its last start to its finish, in words that stay on one line."""
    if obj.started_at is None or obj.finished_at is None or obj.finished_at < obj.started_at:
        return "-"
    return _one_line(duration((obj.finished_at - obj.started_at).total_seconds()))


def _one_line(words: str) -> str:
    return words.replace(" ", "\u00a0")


@admin.display(description="payload, result and error in the job list")
def mirror_copy(obj: MirroredJob) -> str:
    """Whether the mirror holds the job's payload, result and error in full
    or cut to ``TEXT_LIMIT`` characters, in plain words."""
    if obj.truncated:
        return f"cut to their first {TEXT_LIMIT} characters"
    return "in full"


def parent_cell(obj: MirroredJob, url: str) -> str:
    """The parent as a ``queue/id`` link to ``url`` that wraps at its joints."""
    return format_html(
        '<a href="{}">{}/<wbr>{}</a>',
        url,
        emq_breakable(obj.parent_queue),
        emq_breakable(obj.parent_id),
    )


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
    """Read live from Redis (one EXISTS), the list's one live column; ``?``
    (titled with the reason) when Redis did not answer."""
    try:
        return emq_flag(get_mq().is_paused(obj.queue), "paused,no")
    except EchoMQError as err:
        return format_html('<span title="Could not read Redis: {}">?</span>', err)


@admin.display(description="no worker for")
def no_worker(obj: MirroredQueue) -> str:
    """Read live from Redis (the live processes, one HMGET of
    ``P:served``): ``no worker for N s`` when no live worker serves the
    queue (counted from its last worker, or its first job; see
    docs/howto/operate.md#echomq_stats), ``-`` when one does or it is not
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
