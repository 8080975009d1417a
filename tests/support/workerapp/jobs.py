"""Handlers for the worker tests (``t.*``). Payloads say what to do."""

from __future__ import annotations

import threading
import time

from echomq_django import EchoMQ, RateLimited, Unrecoverable, handler


@handler("t.echo")
def echo(job):
    """Returns the payload."""
    return job.payload


RECORDED: list = []  # payloads t.record saw, in the order it ran them


@handler("t.record")
def record(job):
    """Appends the payload to ``RECORDED`` and returns it."""
    RECORDED.append(job.payload)
    return job.payload


@handler("t.sum_children")
def sum_children(job):
    """Returns the sum of the children's results (numbers)."""
    return sum(job.children_values().values())


@handler("t.fail")
def fail(job):
    """Always raises ``ValueError(payload["message"])`` (default "boom")."""
    raise ValueError((job.payload or {}).get("message", "boom"))


@handler("t.unrecoverable")
def unrecoverable(job):
    """Raises ``Unrecoverable``: the job dies at once."""
    raise Unrecoverable("card reported stolen")


@handler("t.flaky")
def flaky(job):
    """Raises on attempts 1..``payload["fail_times"]``, then returns the attempt."""
    if job.attempts <= job.payload["fail_times"]:
        raise RuntimeError(f"flaky attempt {job.attempts}")
    return {"attempt": job.attempts}


@handler("t.slow")
def slow(job):
    """Sleeps ``payload`` seconds, then returns it."""
    time.sleep(job.payload)
    return job.payload


GATES: dict[str, threading.Event] = {}  # t.gate waits on GATES[payload]


@handler("t.gate")
def gate(job):
    """Waits until the test sets ``GATES[payload]`` (10 s at most), then
    returns the payload: a job a test can hold running."""
    GATES.setdefault(job.payload, threading.Event()).wait(10)
    return job.payload


@handler("t.bad_result")
def bad_result(job):
    """Returns something JSON cannot encode."""
    return object()


def _dig(depth: int):
    if depth <= 0:
        raise LookupError("deep down")
    try:
        _dig(depth - 1)
    except LookupError as exc:
        raise LookupError("deep down") from exc


@handler("t.raise")
def deep_raise(job):
    """Raises ``LookupError("deep down")`` chained ``payload`` times (a long
    traceback, for the trimming)."""
    return _dig(job.payload)


@handler("t.lose_lease")
def lose_lease(job):
    """On attempt 1, expires its own lease the way the pump would (a sweep
    whose clock is far ahead), so the worker's report finds the lease lost;
    later attempts return the attempt number."""
    if job.attempts == 1:
        mq = job._mq
        thief = EchoMQ(mq.client, prefix=mq.keys.prefix, clock=lambda: mq.clock() + 10**9)
        thief.timers.recover_stalled(job.queue)
    return job.attempts


@handler("t.async_echo")
async def async_echo(job):
    """An ``async def`` handler: returns the payload after a loop turn."""
    import asyncio

    await asyncio.sleep(0)
    return {"echo": job.payload}


@handler("t.async_fail")
async def async_fail(job):
    """An ``async def`` handler that raises ``ValueError("async boom")``."""
    raise ValueError("async boom")


@handler("t.async_sleep")
async def async_sleep(job):
    """An ``async def`` handler: awaits ``payload`` seconds, returns it."""
    import asyncio

    await asyncio.sleep(job.payload)
    return job.payload


@handler("t.async_orm")
async def async_orm(job):
    """Counts users through the async ORM (a thread-sensitive sync_to_async
    call, served by the worker's handler thread)."""
    import threading

    from django.contrib.auth.models import User

    return {"users": await User.objects.acount(), "thread": threading.current_thread().name}


# Time limits and RateLimited (tests/test_worker_limits.py): a handler that blocks until
# released, and one that is rate limited on its first call per job
RELEASE = threading.Event()
SEEN: list = []  # (job id, job.timed_out) as each t.block handler returns
LIMITED: set = set()


@handler("t.block")
def block(job):
    """Blocks until ``RELEASE`` is set (at most 30 s), then returns."""
    RELEASE.wait(30)
    SEEN.append((job.id, job.timed_out))
    return "late"


@handler("t.rate_limited")
def rate_limited(job):
    """Raises ``RateLimited(payload)`` the first time it sees a job id."""
    if job.id not in LIMITED:
        LIMITED.add(job.id)
        raise RateLimited(job.payload)
    return job.attempts


@handler("t.decimal_total")
def decimal_total(job):
    """Returns ``{"total": Decimal}`` of the payload's ``prices`` (strings):
    a result only Django's JSON encoder takes."""
    from decimal import Decimal

    return {"total": sum(Decimal(p) for p in job.payload["prices"])}


@handler("t.until_cancelled")
def until_cancelled(job):
    """Runs until the worker learns the job was cancelled (``job.cancelled``;
    10 s at most), then returns whether it was."""
    deadline = time.monotonic() + 10
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    return job.cancelled
