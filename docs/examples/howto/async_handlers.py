"""An ``async def`` handler (docs/howto/async-handlers.md)."""

import asyncio

from django.contrib.auth.models import User

import echomq_django as emq


@emq.handler("mail.greet")
async def greet(job):
    """Awaits the async ORM and other coroutines; the worker runs it on an
    event loop of its own."""
    user = await User.objects.aget(pk=job.payload["user"])
    await asyncio.sleep(0)  # e.g. an HTTP call with httpx.AsyncClient
    return {"greeted": user.username}


async def greet_later(user_id):
    """From an async view: ``aenqueue`` is ``enqueue`` for async code."""
    return await emq.aenqueue("mail", "mail.greet", {"user": user_id})
