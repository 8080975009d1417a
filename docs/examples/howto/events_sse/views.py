import asyncio  # for the async view, ajob_events
import json

from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse

import echomq_django as emq

KEEPALIVE_S = 15.0  # s of silence before a comment line keeps proxies from closing
FINAL = {"completed", "dead", "cancelled", "removed"}  # kinds after which the stream ends


def frame(event_id: str, kind: str, data: dict) -> str:
    """One server-sent event: ``id`` lets a reconnecting browser resume."""
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


def job_events(request, queue: str, job_id: str):
    # a browser that reconnects sends the last id it saw: resume right after it
    since = request.headers.get("Last-Event-ID")
    kinds = ["active", "progress", "failed", *sorted(FINAL)]
    try:
        follow = emq.events(queue, since=since, kinds=kinds, block_s=KEEPALIVE_S)
    except ValueError as err:  # a bad queue name or Last-Event-ID: before any Redis I/O
        return HttpResponseBadRequest(str(err))
    follow.start()  # from here on nothing is missed; then read the state
    try:
        job = emq.get_job(queue, job_id)
    except emq.JobNotFound:
        raise Http404(f"no job {job_id!r} in queue {queue!r}") from None

    def stream():
        with follow:
            yield frame(follow.position[queue], "state", {"state": job.state})
            if job.state in ("completed", "dead"):
                return  # already finished: this state frame is the only one
            while True:
                for event in follow:
                    if event.job_id != job_id:
                        continue  # another job of the queue (a gap names none)
                    data = {"job": job_id, **event.fields}
                    if event.kind == "completed":
                        data["result"] = emq.get_job(queue, job_id).result
                    yield frame(event.id, event.kind, data)
                    if event.kind in FINAL:
                        return
                yield ": keep-alive\n\n"  # KEEPALIVE_S passed with nothing: go on

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: send each frame at once
    return response


async def ajob_events(request, queue: str, job_id: str):
    # under ASGI: an async generator, so Django streams it as it goes (a sync
    # one would be read to its end before the first byte is sent)
    since = request.headers.get("Last-Event-ID")
    kinds = ["active", "progress", "failed", *sorted(FINAL)]
    try:
        follow = emq.events(queue, since=since, kinds=kinds, block_s=KEEPALIVE_S)
    except ValueError as err:
        return HttpResponseBadRequest(str(err))
    await asyncio.to_thread(follow.start)
    try:
        job = await asyncio.to_thread(emq.get_job, queue, job_id)
    except emq.JobNotFound:
        raise Http404(f"no job {job_id!r} in queue {queue!r}") from None

    async def stream():
        async with follow:
            yield frame(follow.position[queue], "state", {"state": job.state})
            if job.state in ("completed", "dead"):
                return
            while True:
                async for event in follow:
                    if event.job_id != job_id:
                        continue
                    data = {"job": job_id, **event.fields}
                    if event.kind == "completed":
                        done = await asyncio.to_thread(emq.get_job, queue, job_id)
                        data["result"] = done.result
                    yield frame(event.id, event.kind, data)
                    if event.kind in FINAL:
                        return
                yield ": keep-alive\n\n"

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response
