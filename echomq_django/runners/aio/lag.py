"""The async pool's watch on its event loop (docs/howto/async-handlers.md#blocking-the-loop).

One coroutine that blocks the loop (``time.sleep``, a sync client, the ORM
called without ``sync_to_async``) holds every other job of the pool, and
nothing inside the loop can say so while it happens. ``LagWatch`` runs one
thread that, only while jobs run, asks the loop to answer every ``LAG_S``
seconds (one ``call_soon_threadsafe``); a loop that has not answered after
``LAG_S`` is blocked: one WARNING names the job whose coroutine holds it (the
loop's current task) and, once it answers, one more says for how long.
Idle, the thread waits on an event with no timeout: an idle worker costs
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("echomq_django.worker")

LAG_S = 0.25  # s: a loop that does not answer for this long is blocked


class LagWatch:
    """Watches ``loop`` (an ``asyncio`` loop running on another thread);
    ``job_of(task)``: the ``Job`` a task runs, or None. ``busy(flag)``
    from the loop (jobs run, or none), ``close()`` from any thread.
    ``blocked``: how many blocks it saw (count)."""

    def __init__(self, loop, job_of: Callable, lag_s: float = LAG_S, name: str = "") -> None:
        self._loop, self._job_of, self.lag_s = loop, job_of, lag_s
        self._busy, self._closing = threading.Event(), threading.Event()
        self.blocked = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}_lag", daemon=True)
        self._thread.start()

    def busy(self, flag: bool) -> None:
        """Jobs run now (True) or none (False)."""
        if flag:
            self._busy.set()
        else:
            self._busy.clear()

    def close(self) -> None:
        """End the thread."""
        self._closing.set()
        self._busy.set()

    def _run(self) -> None:
        while True:
            self._busy.wait()  # idle: no timeout, no wake-ups
            if self._closing.is_set():
                return
            answered = threading.Event()
            sent = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop closed
                return
            if not answered.wait(self.lag_s):
                self._blocked(answered, sent)
            self._closing.wait(self.lag_s)  # the next question, while busy

    def _blocked(self, answered: threading.Event, sent: float) -> None:
        """The loop did not answer: name the job holding it, wait for it."""
        self.blocked += 1
        try:
            job = self._job_of(asyncio.current_task(self._loop))
        except Exception:  # the task ended meanwhile
            job = None
        who = f"job {job.queue}/{job.id} ({job.name})" if job is not None else "a job"
        log.warning(
            "the async pool's event loop has been blocked for over %.2f s by %s: a coroutine "
            "ran blocking code (time.sleep, a sync client, the ORM without sync_to_async) "
            "and every job of this worker waits meanwhile; run it with `await "
            "sync_to_async(...)` or on --pool thread (docs/howto/async-handlers.md)",
            self.lag_s,
            who,
        )
        while not answered.wait(self.lag_s):  # a safety net: a closing pool ends the watch
            if self._closing.is_set():
                return
        log.warning("the async pool's event loop answered again after %.2f s blocked by %s",
                    time.monotonic() - sent, who)  # fmt: skip
