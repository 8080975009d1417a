from django.http import JsonResponse

import echomq_django as emq


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
