import echomq_django as emq


def report_step(step: str, percent: int) -> None:
    """Called from a Django @task's body: the task gets no Job, current_job()
    is the job that runs it (None outside a worker)."""
    job = emq.current_job()
    if job is not None:
        job.log(step)
        job.report_progress(percent)
