from django.http import JsonResponse

import echomq_django as emq


def quote(request, sku: str):
    # on_commit=False: a job added on commit would not exist yet while this
    # view, inside the request's transaction, waits for it
    job_id = emq.enqueue("quotes", "quotes.price", {"sku": sku}, on_commit=False)
    try:
        job = emq.wait("quotes", job_id, timeout_s=2.0)
    except TimeoutError:  # still running: the client polls the job later
        return JsonResponse({"job": job_id, "state": "running"}, status=202)
    except emq.JobDead as dead:  # failed for good, or cancelled
        # its first line only ("ExcType: message"): the traceback after it is
        # for the admin and the logs, not for the site's visitors
        return JsonResponse({"job": job_id, "error": dead.headline}, status=502)
    return JsonResponse(job.result)


async def aquote(request, sku: str):
    job_id = await emq.aenqueue("quotes", "quotes.price", {"sku": sku}, on_commit=False)
    try:
        job = await emq.await_result("quotes", job_id, timeout_s=2.0)
    except TimeoutError:
        return JsonResponse({"job": job_id, "state": "running"}, status=202)
    except emq.JobDead as dead:
        return JsonResponse({"job": job_id, "error": dead.headline}, status=502)
    return JsonResponse(job.result)
