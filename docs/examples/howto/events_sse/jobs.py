import echomq_django as emq


@emq.handler("exports.render")
def render(job):
    return {"rows": job.payload["rows"], "url": f"/exports/{job.id}.csv"}
