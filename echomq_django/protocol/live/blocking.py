"""Blocking reads for async callers: each on a thread of its own
(docs/howto/wait.md#many-waiters-in-one-process).

``asyncio.to_thread`` and ``sync_to_async`` share the event loop's default
executor, a few threads (``min(32, cpus + 4)``). A wait or an events step
holds its thread for as long as it blocks (seconds, or until an event
comes), so a handful of open follows there would hold up every other
``await`` of the process. A thread per blocking call costs about 50 µs to
start and is bounded by what the caller awaits at once (each also holds
one Redis connection of the client's pool).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


async def off_loop(fn: Callable[..., Any], *args: Any, name: str = "echomq-blocking") -> Any:
    """``fn(*args)`` on a new daemon thread, awaited without blocking the
    event loop; its return value, or its exception raised here. A cancelled
    await does not stop the thread: ``fn`` must end by itself (each of ours
    blocks for one socket-timeout slice at most and checks a flag the
    caller sets on cancel)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(value: Any, err: BaseException | None) -> None:
        if done.cancelled():
            return
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(value)

    def run() -> None:
        try:
            value, err = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            value, err = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, err)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody awaits this any more

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
