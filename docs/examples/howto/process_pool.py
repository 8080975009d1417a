"""A handler that wants a process of its own (docs/howto/process-pool.md)."""

import os

import echomq_django as emq


@emq.handler("reports.render")
def render(job):
    """Stands in for a PDF library that leaks memory or can hang in C: under
    ``--pool process`` it runs in a handler process the worker can end."""
    return {"pages": job.payload["pages"], "pid": os.getpid()}


def run_reports_once():
    """What ``manage.py runworker reports --pool process --concurrency 2
    --max-jobs-per-child 500 --max-memory-per-child 400 --burst`` runs."""
    worker = emq.Worker(
        ["reports"],
        concurrency=2,
        pool="process",
        max_jobs_per_child=500,  # jobs, then a fresh process
        max_memory_per_child=400,  # MiB resident after a job, then a fresh process
        register=False,
    )
    return worker.run(burst=True)
