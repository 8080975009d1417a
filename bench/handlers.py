"""The benchmark's handlers: each returns a small value at once (its node's
index, ``"done"`` for the root). Imported by every worker process."""

from echomq_django import handler

from .topologies import BRANCH, LEAF, ROOT


@handler(LEAF)
def leaf(job):
    return job.payload["i"]


@handler(BRANCH)
def branch(job):
    return job.payload["i"]


@handler(ROOT)
def root(job):
    return "done"
