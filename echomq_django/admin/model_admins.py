"""The admin: read-only pages over the Redis mirror, and retry by id
(docs/howto/operate.md#what-the-admins-pages-show).

Read-only by construction: both models have only the ``view`` permission
(models.py) and every ``has_add/change/delete_permission`` here answers
False, for superusers too, so the add, change (POST) and delete URLs answer
403. The one write is retry-by-id (an action on selected jobs, and a
queue + id form): POST-only behind a confirmation page, guarded by
``echomq_django.retry_job``, done through ``EchoMQ.retry`` (the API a user
calls), logged as one ``LogEntry`` (CHANGE, "Retried by id") per retried job.
Job and queue pages read Redis live, the mirror when Redis cannot answer
(pages.py); lists read the mirror, which the
"Refresh from Redis" button, the pump and ``echomq_mirror`` keep current.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import (
    Http404,
    HttpResponseBadRequest,
    HttpResponseNotFound,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from ..conf import get_mq
from ..core.exceptions import EchoMQError, JobNotFound, JobNotRetryable
from ..core.keyspace import validate_id, validate_queue
from ..models import MirroredJob, MirroredQueue
from ..monitoring.mirror import mirror_jobs, mirror_queues, mirror_targets
from ..monitoring.stats import UnknownQueue
from ..runners import heartbeat
from . import actions as ops
from . import dashboard as board
from . import display as show
from . import worker_commands
from .pages import job_page, job_url, queue_page, workers_page

RETRY_PERMISSION = "echomq_django.retry_job"
LOGGED_MESSAGE = "Retried by id"


def _mirror_times() -> dict:
    return {"mirrored_queues": list(MirroredQueue.objects.only("queue", "mirrored_at"))}


class MirrorAdmin(admin.ModelAdmin):
    """Read-only model admin over a mirror table, with a POST-only
    ``refresh/`` URL and the mirror times on its list page."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def url_name(self, view: str) -> str:
        """``admin:<app>_<model>_<view>``, the name of one of this admin's URLs."""
        return f"admin:{self.opts.app_label}_{self.opts.model_name}_{view}"

    def extra_urls(self, wrap) -> list:
        return []

    def get_urls(self):
        wrap = self.admin_site.admin_view
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("refresh/", wrap(require_POST(self.refresh_view)), name=f"{prefix}_refresh"),
            *self.extra_urls(wrap),
            *super().get_urls(),
        ]

    def refresh_view(self, request):
        """Mirror every known queue now (incrementally), then back to the list."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            mq = get_mq()
            reports = mirror_queues(mq, mirror_targets(mq))
        except EchoMQError as err:
            messages.error(request, f"Could not read Redis: {err}")
        else:
            jobs = sum(r["jobs"] for r in reports.values())
            gone = sum(r["gone"] for r in reports.values())
            messages.success(
                request,
                f"Mirrored {len(reports)} queues from Redis: {jobs} job "
                f"rows refreshed, {gone} marked gone from Redis.",
            )
        return redirect(self.url_name("changelist"))

    def changelist_view(self, request, extra_context=None):
        extra = {**_mirror_times(), "unmirrored": _unmirrored(), **(extra_context or {})}
        return super().changelist_view(request, extra)


def _unmirrored() -> list[str]:
    """Known queues (heartbeat.known_queues) the mirror has not reached yet:
    before the pump's first sweep a queue would otherwise just be missing."""
    try:
        known = heartbeat.known_queues(get_mq())
    except EchoMQError:
        return []
    mirrored = set(MirroredQueue.objects.values_list("queue", flat=True))
    return [q for q in known if q not in mirrored]


class RetryByIdForm(forms.Form):
    """The queue and id of one job to retry."""

    queue = forms.CharField(max_length=64)
    job_id = forms.CharField(label="Job id", max_length=128)

    def _valid(self, name: str, check):
        try:
            return check(self.cleaned_data[name])
        except ValueError as err:
            raise ValidationError(str(err)) from None

    def clean_queue(self) -> str:
        return self._valid("queue", validate_queue)

    def clean_job_id(self) -> str:
        return self._valid("job_id", validate_id)


@admin.register(MirroredJob)
class MirroredJobAdmin(MirrorAdmin):
    list_display = (
        "job",
        show.state_badge,
        show.error_preview,
        show.times,
        "parent_link",
    )
    list_display_links = None  # the job cell links its id only (show.job_cell)
    list_filter = ("queue", "state", show.HasErrorFilter, "name", show.InRedisFilter)
    search_fields = ("job_id", "name")
    ordering = ("-created_at", "-id")
    actions = ("retry_dead_jobs", ops.cancel_jobs, ops.remove_jobs)
    readonly_fields = (show.mirror_copy,)
    # Only what never changes, and what the mirror itself is: state,
    # attempts, times and parent are shown once, in the page's summary, live
    # when Redis answers (docs/howto/operate.md#what-the-admins-pages-show).
    fieldsets = (
        (None, {"fields": ("queue", "job_id", "name")}),
        ("In the job list (the mirror)", {"fields": ("mirrored_at", show.mirror_copy)}),
    )

    @admin.display(description="job", ordering="job_id")
    def job(self, obj: MirroredJob) -> str:
        return show.job_cell(reverse(self.url_name("change"), args=[obj.pk]), obj)

    @admin.display(description="parent")
    def parent_link(self, obj: MirroredJob) -> str:
        if not obj.parent_id:
            return "-"
        return show.parent_cell(obj, job_url(obj.parent_queue, obj.parent_id))

    def has_retry_permission(self, request) -> bool:
        return request.user.has_perm(RETRY_PERMISSION)

    def changelist_view(self, request, extra_context=None):
        extra = {"can_retry": self.has_retry_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def extra_urls(self, wrap) -> list:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("retry/", wrap(self.retry_by_id_view), name=f"{prefix}_retry"),
            path("job/<str:queue>/<path:job_id>/", wrap(self.lookup_view), name=f"{prefix}_lookup"),
        ]

    def lookup_view(self, request, queue: str, job_id: str):
        """Redirect to the page of job ``queue``/``job_id``; a job Redis holds
        but the mirror has not reached yet is mirrored first. 404 otherwise."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            validate_queue(queue)
            validate_id(job_id)
        except ValueError:
            raise Http404("no such job") from None
        row = MirroredJob.objects.filter(queue=queue, job_id=job_id).first()
        try:
            if row is None and mirror_jobs(get_mq(), [(queue, job_id)]):
                row = MirroredJob.objects.get(queue=queue, job_id=job_id)
        except EchoMQError as err:
            messages.error(request, f"Could not read Redis: {err}")
            return redirect(self.url_name("changelist"))
        if row is None:
            raise Http404(f"job {job_id!r} is neither in Redis nor in the mirror of {queue!r}")
        return HttpResponseRedirect(reverse(self.url_name("change"), args=[row.pk]))

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        try:
            page = int(request.GET.get("page", "1"))
        except ValueError:
            page = 1
        context.update(
            job_page(get_mq(), obj, page),
            queue_mirror=MirroredQueue.objects.filter(queue=obj.queue).first(),
            can_retry=self.has_retry_permission(request),
            retry_url=reverse(self.url_name("retry")),
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -- retry by id -------------------------------------------------------
    @admin.action(permissions=["retry"], description="Retry selected dead jobs by id")
    def retry_dead_jobs(self, request, queryset):
        targets = [(j.queue, j.job_id) for j in queryset]
        if request.POST.get("post") == "yes":
            self.retry(request, targets)
            return None  # back to the list, with the messages
        hidden = [("action", "retry_dead_jobs"), ("post", "yes")]
        hidden += [(ACTION_CHECKBOX_NAME, str(pk)) for pk in queryset.values_list("pk", flat=True)]
        return self.retry_confirmation(
            request, targets, hidden, reverse(self.url_name("changelist"))
        )

    def retry_by_id_view(self, request):
        """GET: the form (``?queue=&job_id=`` prefill it). POST: the
        confirmation page; POST with ``confirm=yes``: the retry."""
        if not self.has_retry_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = RetryByIdForm(request.POST)
            if form.is_valid():
                target = (form.cleaned_data["queue"], form.cleaned_data["job_id"])
                if request.POST.get("confirm") != "yes":
                    hidden = [("queue", target[0]), ("job_id", target[1]), ("confirm", "yes")]
                    return self.retry_confirmation(request, [target], hidden, request.path)
                if self.retry(request, [target]):
                    return redirect(job_url(*target))
                return redirect(self.url_name("retry"))
        else:
            form = RetryByIdForm(initial={k: request.GET.get(k, "") for k in ("queue", "job_id")})
        return TemplateResponse(
            request,
            "admin/echomq_django/retry_by_id.html",
            {
                **self.admin_site.each_context(request),
                **_mirror_times(),
                "opts": self.opts,
                "title": "Retry a dead job by id",
                "form": form,
            },
        )

    def has_manage_permission(self, request) -> bool:
        return ops.has_manage_permission(request)

    def get_actions(self, request, action_location=None):
        """Cancel and remove appear once ``EchoMQ`` has them
        (docs/explanation/lifecycle.md).
        ``action_location``: Django 6.1's place on the page the actions are
        for (None: the change list, as on Django 5.2, whose admin has no
        such argument)."""
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        for op in ops.JOB_OPERATIONS:
            if not hasattr(get_mq(), op):
                actions.pop(f"{op}_jobs", None)
        return actions

    def retry_confirmation(self, request, targets, hidden, action_url, **words):
        """The page that asks before retrying (or, with ``title``,
        ``question`` and ``button``, before another operation): each job
        with its live state."""
        mq, rows = get_mq(), []
        try:
            for queue in dict.fromkeys(q for q, _ in targets):
                ids = [j for q, j in targets if q == queue]
                live = mq.probes.states(queue, ids)
                rows += [{"queue": queue, "id": j, "state": live[j]} for j in ids]
        except EchoMQError as err:
            messages.error(request, f"Could not read Redis: {err}")
            return redirect(self.url_name("changelist"))
        return TemplateResponse(
            request,
            "admin/echomq_django/retry_confirm.html",
            {
                **self.admin_site.each_context(request),
                **_mirror_times(),
                "opts": self.opts,
                "title": words.get("title", "Retry dead jobs by id?"),
                "question": words.get("question"),
                "button": words.get("button"),
                "jobs": rows,
                "hidden": hidden,
                "action_url": action_url,
            },
        )

    def retry(self, request, targets) -> list[tuple[str, str]]:
        """``EchoMQ.retry`` each ``(queue, id)``; a message per outcome, a
        LogEntry per retried job, then the affected jobs are re-mirrored.
        Returns the retried targets."""
        mq, done, affected = get_mq(), [], []
        for queue, job_id in targets:
            try:
                outcome = mq.retry(queue, job_id)
            except JobNotFound as err:
                messages.error(request, f"Not retried: {err} (unknown id).")
            except JobNotRetryable as err:
                messages.warning(request, f"Not retried: {err}.")
            except (EchoMQError, ValueError) as err:
                messages.error(request, f"Not retried: {queue}/{job_id}: {err}")
            else:
                done.append((queue, job_id))
                affected += [(queue, job_id), *outcome.retried, *outcome.revived, *outcome.released]
                revived = "".join(
                    f"; {q}/{i} back to awaiting_children" for q, i in outcome.revived
                )
                messages.success(
                    request, f"Retried {queue}/{job_id}: now {outcome.state}{revived}."
                )
        mirror_jobs(mq, affected)
        for queue, job_id in done:
            self.log_change(
                request, MirroredJob.objects.get(queue=queue, job_id=job_id), LOGGED_MESSAGE
            )
        return done


@admin.register(MirroredQueue)
class MirroredQueueAdmin(MirrorAdmin):
    list_display = (
        "queue",
        *show.COUNT_COLUMNS.values(),
        "outbox",
        "deadletter",
        show.oldest_pending,
        show.paused,
        show.no_worker,
        "mirrored_at",
    )
    actions = (ops.pause_queues, ops.resume_queues)
    # the counts are shown once, in the page's summary: live when Redis
    # answers, else the mirror's (docs/howto/operate.md#what-the-admins-pages-show)
    fields = ("queue", "mirrored_at", "last_event_id")

    def has_manage_permission(self, request) -> bool:
        return ops.has_manage_permission(request)

    def extra_urls(self, wrap) -> list:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("workers/", wrap(self.workers_view), name=f"{prefix}_workers"),
            path("dashboard/", wrap(self.dashboard_view), name=f"{prefix}_dashboard"),
            path("dashboard.json", wrap(self.dashboard_view), name=f"{prefix}_dashboard_json"),
        ]

    def dashboard_view(self, request):
        """Every queue at a glance, live (docs/howto/operate.md#the-dashboard);
        ``dashboard.json`` answers the same as JSON for the page's refresh.
        ``?range=hour|day``, ``?queue=<name>`` (repeatable). An unknown queue
        is a 404 naming the known ones; a range the counters do not keep,
        a 400 naming the kept ones."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        only = request.GET.getlist("queue")
        try:
            minutes = board.minutes_of(request.GET.get("range"))
            ctx = board.dashboard(get_mq(), only, minutes)
        except board.BadRange as err:
            return HttpResponseBadRequest(str(err), content_type="text/plain")
        except UnknownQueue as err:
            return HttpResponseNotFound(str(err), content_type="text/plain")
        except EchoMQError as err:
            ctx = {"live_error": str(err), "queues": [], "minutes": minutes, "at": None}
        if request.path.endswith(".json"):
            if "live_error" in ctx:  # the page's script keeps its numbers and says why
                return JsonResponse({**ctx, "queues": {}})
            return JsonResponse(board.dashboard_json(ctx))
        query = request.GET.urlencode()
        return TemplateResponse(
            request,
            "admin/echomq_django/dashboard.html",
            {
                **self.admin_site.each_context(request),
                **ctx,
                "ranges": list(board.RANGES.items()),
                "only": only[0] if len(only) == 1 else "",
                "json_url": reverse("admin:echomq_django_mirroredqueue_dashboard_json")
                + (f"?{query}" if query else ""),
                "refresh_s": board.REFRESH_S,
                "opts": self.opts,
                "title": "Dashboard",
            },
        )

    def workers_view(self, request):
        """The live workers and pumps, read from Redis now
        (docs/howto/operate.md#live-workers-and-pumps)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":  # a command (worker_commands.py)
            return worker_commands.post(request, self.model, request.path)
        mq = get_mq()
        return TemplateResponse(
            request,
            "admin/echomq_django/workers.html",
            {
                **self.admin_site.each_context(request),
                **workers_page(mq),
                **worker_commands.page_context(mq, request),
                "opts": self.opts,
                "title": "Live workers and pumps",
            },
        )

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context.update(
            queue_page(get_mq(), obj),
            queue_mirror=obj,
            jobs_url=show.jobs_url(obj.queue),
            dead_url=show.jobs_url(obj.queue, "dead"),
        )
        return super().render_change_form(request, context, add, change, form_url, obj)
