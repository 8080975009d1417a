"""Handlers of the fault suite. Payloads say what to do; each is quick but
not instant, so a SIGKILL lands while jobs run."""

from __future__ import annotations

import os
import time

from echomq_django import handler


@handler("fault.leaf")
def leaf(job):
    """Sleeps ``payload["ms"]`` ms; returns ``payload["n"]``, or raises when
    ``payload["bad"]`` (every attempt: the job dies)."""
    time.sleep(job.payload["ms"] / 1000)
    if job.payload.get("bad"):
        raise RuntimeError(f"{job.id} always fails")
    return job.payload["n"]


@handler("fault.parent")
def parent(job):
    """Returns how many of its children completed (their values)."""
    time.sleep(job.payload["ms"] / 1000)
    return len(job.children_values())


@handler("fault.once")
def once(job):
    """Appends ``<id> <pid>`` to the file ``payload["log"]`` (one small
    O_APPEND write: the tests count the runs of each job and see which
    worker ran it), sleeps ``payload["ms"]`` ms; returns ``payload["n"]``."""
    with open(job.payload["log"], "a") as f:
        f.write(f"{job.id} {os.getpid()}\n")
    time.sleep(job.payload.get("ms", 0) / 1000)
    return job.payload.get("n")
