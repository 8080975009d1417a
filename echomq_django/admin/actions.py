"""The admin's operations on jobs and queues (docs/explanation/lifecycle.md): cancel
and remove selected jobs (behind a confirmation page, like retry), pause and
resume selected queues. Each goes through the API a user calls
(``EchoMQ.cancel`` / ``remove`` / ``pause`` / ``resume``), is guarded by the
``echomq_django.manage_job`` permission, reports one message per target and
is recorded as one ``LogEntry`` per target; the jobs' queues are re-mirrored
after it.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse

from ..conf import get_mq
from ..core.exceptions import EchoMQError, JobNotCancellable, JobNotFound, JobNotRemovable
from ..monitoring.mirror import mirror_queues

MANAGE_PERMISSION = "echomq_django.manage_job"

# operation -> (verb, past tense, what the confirmation says, refusals that are warnings)
JOB_OPERATIONS = {
    "cancel": (
        "Cancel",
        "Cancelled",
        "Cancel these jobs? A pending, delayed or awaiting job dies now with the error "
        "'cancelled', with its unfinished subtree, and its parent's policy applies; an "
        "active job dies when its worker next reports.",
        (JobNotFound, JobNotCancellable),
    ),
    "remove": (
        "Remove",
        "Removed",
        "Remove these jobs from Redis, each with its whole subtree? A removed child "
        "resolves its parent like remove_dependency (the parent goes on). An active job "
        "is refused. This cannot be undone.",
        (JobNotFound, JobNotRemovable),
    ),
}


def has_manage_permission(request) -> bool:
    return request.user.has_perm(MANAGE_PERMISSION)


def _run_job_operation(modeladmin, request, queryset, op: str):
    verb, past, question, refusals = JOB_OPERATIONS[op]
    targets = [(j.queue, j.job_id) for j in queryset]
    if request.POST.get("post") != "yes":
        hidden = [("action", f"{op}_jobs"), ("post", "yes")]
        hidden += [(ACTION_CHECKBOX_NAME, str(pk)) for pk in queryset.values_list("pk", flat=True)]
        return modeladmin.retry_confirmation(
            request,
            targets,
            hidden,
            reverse(modeladmin.url_name("changelist")),
            title=f"{verb} jobs?",
            question=question,
            button=f"Yes, {verb.lower()}",
        )
    mq, done, queues = get_mq(), [], {q for q, _ in targets}
    for queue, job_id in targets:
        try:
            report = getattr(mq, op)(queue, job_id)
        except refusals as err:
            messages.warning(request, f"Not {past.lower()}: {err}.")
        except (EchoMQError, ValueError) as err:
            messages.error(request, f"Not {past.lower()}: {queue}/{job_id}: {err}")
        else:
            done.append((queue, job_id))
            queues |= {q for q, _ in report.outcome.released} | {q for q, _ in report.outcome.dead}
            detail = f" (it was {report.state})" if op == "cancel" and report.state else ""
            if op == "remove" and report.removed > 1:
                detail = f" with {report.removed - 1} more jobs of its subtree"
            messages.success(request, f"{past} {queue}/{job_id}{detail}.")
    try:
        mirror_queues(mq, sorted(queues))
    except EchoMQError as err:
        messages.error(request, f"Could not refresh the mirror: {err}")
    rows = {(j.queue, j.job_id): j for j in queryset}
    for target in done:
        modeladmin.log_change(request, rows[target], f"{past} (admin action)")
    return None


@admin.action(permissions=["manage"], description="Cancel selected jobs")
def cancel_jobs(modeladmin, request, queryset):
    return _run_job_operation(modeladmin, request, queryset, "cancel")


@admin.action(permissions=["manage"], description="Remove selected jobs (with their subtrees)")
def remove_jobs(modeladmin, request, queryset):
    return _run_job_operation(modeladmin, request, queryset, "remove")


def _set_paused(modeladmin, request, queryset, pause: bool) -> None:
    mq = get_mq()
    for row in queryset:
        try:
            changed = mq.pause(row.queue) if pause else mq.resume(row.queue)
        except EchoMQError as err:
            messages.error(request, f"{row.queue}: {err}")
            continue
        word = "Paused" if pause else "Resumed"
        if changed:
            messages.success(request, f"{word} {row.queue}.")
            modeladmin.log_change(request, row, f"{word} (admin action)")
        else:
            messages.info(
                request, f"{row.queue} was {'paused' if pause else 'not paused'} already."
            )


@admin.action(permissions=["manage"], description="Pause selected queues (no claims)")
def pause_queues(modeladmin, request, queryset):
    _set_paused(modeladmin, request, queryset, True)


@admin.action(permissions=["manage"], description="Resume selected queues")
def resume_queues(modeladmin, request, queryset):
    _set_paused(modeladmin, request, queryset, False)
