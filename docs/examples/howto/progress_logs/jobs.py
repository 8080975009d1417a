import echomq_django as emq


@emq.handler("media.thumbnails")
def thumbnails(job):
    images = job.payload["images"]
    for n, name in enumerate(images, start=1):
        job.log(f"resized {name}")  # one line per image, the newest KEEP_LOGS kept
        job.report_progress(round(100 * n / len(images)))
    job.report_progress({"stage": "done", "images": len(images)})
    return {"thumbnails": len(images)}
