"""docs/howto/progress-and-logs.md: a handler that reports its progress and
writes log lines, a Django task that does the same through current_job(),
and a view that shows both while the job runs."""

from django.http import JsonResponse

import echomq_django as emq


@emq.handler("media.thumbnails")
def thumbnails(job):
    images = job.payload["images"]
    for n, name in enumerate(images, start=1):
        job.log(f"resized {name}")  # one line per image, the newest KEEP_LOGS kept
        job.report_progress(round(100 * n / len(images)))
    job.report_progress({"stage": "done", "images": len(images)})
    return {"thumbnails": len(images)}


def status(request, job_id: str):
    """What a page polls, or what a server-sent events view pushes."""
    try:
        job = emq.get_job("media", job_id)
    except emq.JobNotFound:  # a bad id, or a job retention removed since
        return JsonResponse({"state": None}, status=404)
    return JsonResponse(
        {
            "state": job.state,
            "progress": job.progress,  # None until the handler reports
            "log": emq.job_logs("media", job_id, start=-5),  # the last five lines
        }
    )


def report_step(step: str, percent: int) -> None:
    """Called from a Django @task's body: the task gets no Job, current_job()
    is the job that runs it (None outside a worker)."""
    job = emq.current_job()
    if job is not None:
        job.log(step)
        job.report_progress(percent)
