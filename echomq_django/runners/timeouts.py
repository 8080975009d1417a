"""Per-attempt time limits for the worker
(docs/explanation/protocol.md#scheduling: ``timeout_ms`` on a
job, ``TIMEOUT_MS`` per queue).

Python cannot kill a thread, so a handler that runs past its limit is not
stopped: its *attempt* is. ``Timeouts`` runs one thread that sleeps until
the earliest limit of the jobs running; when a limit passes first, the job is
settled as timed out (``job.timed_out`` becomes True, for a handler that
looks), and ``on_timeout(job, limit_ms)`` fails the attempt through the
reporter, so it is retried by the usual rules. When the handler returns
later, ``settle`` answers False and its result is discarded.

Capacity is kept: the worker writes the stuck thread off (``HandlerPool.
write_off``), so a fresh thread takes its place and the worker still runs
``concurrency`` handlers at once; the stuck thread leaves the pool when its
handler returns. A thread that never returns stays written off: when more
threads are stuck than the worker's ``max_stuck`` (default: its
``concurrency``), the worker stops claiming and ``run()`` returns (logged at
ERROR), for a supervisor to restart the process rather than let it grow
threads without bound.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from ..core.jobs import Job
from .pool import decided
from .reporter import Finished

log = logging.getLogger("echomq_django.worker")


class Timeouts:
    """The running jobs' time limits; ``on_timeout(job, limit_ms)`` is called
    on this object's thread for each job whose limit passed before its
    handler returned."""

    def __init__(self, on_timeout: Callable[[Job, int], None]) -> None:
        self._on_timeout = on_timeout
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Job, int]] = []  # (deadline, seq, job, limit ms)
        self._live: dict[int, Job] = {}  # id(job) -> job: limited, not settled
        self._timed_out: set[int] = set()  # id(job): settled by its limit, handler still running
        self._seq = itertools.count()
        self._closing = False

    def start(self, job: Job, limit_ms: int | None) -> None:
        """A handler starts on ``job``; ``limit_ms`` (ms) None means no limit (such a
        job is not watched: its ``settle`` would answer True, and may be skipped)."""
        if limit_ms is None:
            return
        with self._cv:
            self._live[id(job)] = job
            deadline = time.monotonic() + limit_ms / 1000
            heapq.heappush(self._heap, (deadline, next(self._seq), job, limit_ms))
            self._cv.notify()

    def settle(self, job: Job) -> bool:
        """The handler of ``job`` returned: True when its result counts, False
        when its limit passed first (the attempt was failed already)."""
        key = id(job)
        with self._cv:
            if self._live.pop(key, None) is not None:
                return True
            if key in self._timed_out:
                self._timed_out.discard(key)
                return False
            return True

    @property
    def stuck(self) -> int:
        """Handlers still running past their limit."""
        with self._cv:
            return len(self._timed_out)

    def close(self) -> None:
        """Stop the thread (``run`` returns)."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def reopen(self) -> None:
        """Start a run: the thread may run again."""
        with self._cv:
            self._closing = False

    def run(self) -> None:
        """The thread: wake at the earliest limit, settle what has passed."""
        while True:
            due = []
            with self._cv:
                while not self._closing:
                    now = time.monotonic()
                    while self._heap and (
                        self._heap[0][0] <= now or id(self._heap[0][2]) not in self._live
                    ):
                        _, _, job, limit = heapq.heappop(self._heap)
                        if self._live.pop(id(job), None) is not None:
                            self._timed_out.add(id(job))
                            job.timed_out = True
                            due.append((job, limit))
                    if due:
                        break
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
                if self._closing:
                    return
            for job, limit in due:
                self._on_timeout(job, limit)


def timed_out(loop, job: Job, limit_ms: int) -> None:
    """On the timeouts thread: ``job`` of ``loop`` (the worker's
    ``ClaimLoop``) ran past ``limit_ms`` (ms). Fail the attempt (the
    reporter retries it by the usual rules) and write its handler off; stop
    claiming when more handlers are stuck than ``loop.max_stuck``."""
    fate = loop.pool.write_off(job)
    error = (f"TimeoutError: the attempt ran longer than its time limit of {limit_ms} ms "
             f"(timeout_ms / TIMEOUT_MS); {fate}")  # fmt: skip
    late = Finished(job, error=error, ms=float(limit_ms))
    loop.done.put(decided(late, TimeoutError(), loop.mq.queues, loop.mq.wire.backoff_cap_ms))
    stuck = loop.timeouts.stuck
    log.warning("job %s/%s (%s) timed out after %d ms", job.queue, job.id, job.name, limit_ms)
    if stuck > loop.max_stuck:
        log.error("%d handler threads are stuck past their jobs' time limits (max_stuck %d): "
                  "the worker stops claiming and returns, for its supervisor to restart it",
                  stuck, loop.max_stuck)  # fmt: skip
        loop.give_up_stuck = True
        loop.stop()
