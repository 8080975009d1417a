"""The soak's handlers (``python -m bench --soak``): mixed outcomes by the
payload's index. Imported by every soak worker process."""

from echomq_django import Unrecoverable, handler

from .soak import DIE_EVERY, FAIL_ONCE_EVERY


@handler("soak.job")
def job(job):
    i = job.payload["i"]
    if i % DIE_EVERY == 7:
        raise Unrecoverable(f"soak job {i} dies")
    if i % FAIL_ONCE_EVERY == 3 and job.attempts == 1:
        raise RuntimeError(f"soak job {i} fails once")
    return i


@handler("soak.parent")
def parent(job):
    return len(job.children_values())
