"""The schedules page (docs/howto/periodic.md#the-admin-page): every periodic
entry, the settings' ones stated read-only, the run-time ones
(``emq.schedules``) paused, resumed and edited, any one run now. Its own
permissions (``PeriodicEntry``: ``view``, ``change`` for edit, pause and
resume, ``run_periodicentry`` for run now); every change is written to the
admin log. Writes go through ``emq.schedules``, the API a user calls.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from ..api.controls import schedules
from ..core.exceptions import DuplicateJob, EchoMQError
from ..models import PeriodicEntry
from .display import jobs_url
from .pages import job_url

ACTIONS = {"pause": "Paused", "resume": "Resumed", "run": "Ran"}
STATES = {"pause": "paused", "resume": "running"}  # what an action that changed nothing found
OPTIONS = ("priority", "max_attempts", "timeout_ms")


def _when(ms: int | None) -> str:
    """``ms`` (since the epoch) as UTC text; '-' for None."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class EntryForm(forms.Form):
    """A run-time entry as ``emq.schedules.upsert`` takes it; the rules
    (a known handler, exactly one of cron and every_s, a cron that fires)
    are upsert's, said with their check ids."""

    handler = forms.CharField(max_length=200, help_text="a registered job name")
    queue = forms.CharField(max_length=64)
    cron = forms.CharField(required=False, help_text="five fields, e.g. */5 * * * *")
    every_s = forms.IntegerField(required=False, min_value=1, label="every (s)")
    tz = forms.CharField(required=False, label="time zone", help_text="a cron's; default TIME_ZONE")
    payload = forms.JSONField(required=False, widget=forms.Textarea(attrs={"rows": 4}))
    priority = forms.IntegerField(required=False)
    max_attempts = forms.IntegerField(required=False, min_value=1)
    timeout_ms = forms.IntegerField(required=False, min_value=1, label="timeout (ms)")

    def upsert_kwargs(self) -> dict:
        """The cleaned fields as ``upsert`` keywords (blank ones left out)."""
        data = self.cleaned_data
        out = {"handler": data["handler"], "queue": data["queue"], "payload": data["payload"]}
        for key in ("cron", "every_s", "tz", *OPTIONS):
            if data.get(key) not in (None, ""):
                out[key] = data[key]
        return out


@admin.register(PeriodicEntry)
class PeriodicEntryAdmin(admin.ModelAdmin):
    """The schedules page in place of a change list (the model has no
    table): ``periodicentry/`` lists, ``<name>/change/`` edits a run-time
    entry, ``act/`` (POST ``entry``, ``action``: pause, resume or run)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_run_permission(self, request) -> bool:
        return request.user.has_perm("echomq_django.run_periodicentry")

    def get_urls(self):
        wrap = self.admin_site.admin_view
        info = "echomq_django_periodicentry"
        return [
            path("", wrap(self.list_view), name=f"{info}_changelist"),
            path("act/", wrap(require_POST(self.act_view)), name=f"{info}_act"),
            path("<path:object_id>/change/", wrap(self.edit_view), name=f"{info}_change"),
        ]

    def _context(self, request, **extra) -> dict:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "can_change": self.has_change_permission(request),
            "can_run": self.has_run_permission(request),
            **extra,
        }

    def list_view(self, request):
        """Every entry, the settings' first (read-only), live from Redis."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            rows = schedules.list()
        except EchoMQError as err:
            rows, error = [], str(err)
        else:
            error = ""
        for row in rows:
            row["edit_url"] = reverse(
                "admin:echomq_django_periodicentry_change", args=(quote(row["entry"]),)
            )
            row["queue_url"] = jobs_url(row["queue"])
            row["last_text"], row["next_text"] = _when(row["last_tick"]), _when(row["next_tick"])
            row["payload_text"] = json.dumps(row.get("payload"))
        ctx = self._context(request, rows=rows, live_error=error, title="Periodic entries")
        return TemplateResponse(request, "admin/echomq_django/schedules.html", ctx)

    def act_view(self, request):
        """Pause, resume or run one entry now, then back to the list; each
        done action is logged. A missing permission is a 403, an unknown
        action a 400; the API's refusals show as an error message."""
        name, action = request.POST.get("entry", ""), request.POST.get("action", "")
        if action not in ACTIONS or not name:
            return HttpResponseBadRequest(
                f"action {action!r} on entry {name!r}: give an entry and one of: "
                + ", ".join(ACTIONS),
                content_type="text/plain",
            )
        allowed = self.has_run_permission if action == "run" else self.has_change_permission
        if not allowed(request):
            raise PermissionDenied
        try:
            if action == "run":
                queue, job_id = schedules.run_now(name)
                done = format_html(
                    'Ran {} now: job <a href="{}">{}/{}</a>.',
                    name,
                    job_url(queue, job_id),
                    queue,
                    job_id,
                )
                logged = f"Ran now: job {queue}/{job_id}"
            else:
                changed = getattr(schedules, action)(name)
                done = (
                    f"{ACTIONS[action]} {name}."
                    if changed
                    else f"{name} was already {STATES[action]}."
                )
                logged = f"{ACTIONS[action]}" if changed else ""
        except (ValueError, DuplicateJob, EchoMQError) as err:
            messages.error(request, str(err))
        else:
            if logged:
                self.log_change(request, PeriodicEntry(name=name), logged)
            messages.success(request, done)
        return redirect("admin:echomq_django_periodicentry_changelist")

    def edit_view(self, request, object_id):
        """A run-time entry's form (``emq.schedules.upsert``); a settings
        entry is read-only: the page says so and takes no POST."""
        name = unquote(object_id)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        page = "admin/echomq_django/schedule_form.html"
        title = f"Periodic entry {name}"
        try:
            current = schedules.get(name)
        except (ValueError, EchoMQError) as err:
            ctx = self._context(request, name=name, refused=str(err), title=title)
            return TemplateResponse(request, page, ctx)
        paused = current.pop("paused")
        form = EntryForm(initial=current)
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            form = EntryForm(request.POST, initial=current)
            if form.is_valid():
                try:
                    schedules.upsert(name, **form.upsert_kwargs())
                except (ValueError, EchoMQError) as err:
                    form.add_error(None, str(err))
                else:
                    changed = ", ".join(form.changed_data) or "nothing"
                    self.log_change(request, PeriodicEntry(name=name), f"Changed {changed}")
                    messages.success(request, f"Saved {name}.")
                    return redirect("admin:echomq_django_periodicentry_changelist")
        ctx = self._context(request, name=name, form=form, paused=paused, title=title)
        return TemplateResponse(request, page, ctx)
