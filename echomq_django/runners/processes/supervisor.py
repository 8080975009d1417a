"""The process pool: ``size`` pre-forked handler processes that the worker
feeds job by job over pipes (docs/howto/process-pool.md#how-it-works).

The worker keeps claiming and reporting as on the thread pool; only the
handler call moves into a child process (``child.py``). One supervisor
thread per pool blocks on every child's pipe and exit at once (a selector;
a self-pipe wakes it for a new job or a kill), writes the jobs to the
children outside the pool's lock and reads each pipe whole (``pipes.py``).
A quick child may hold ``DEPTH`` jobs in its pipe (it reads the next as it
replies, awake); those it never began go to another child if it leaves.

Why ``fork`` and not ``forkserver``: a forked child starts in milliseconds
with Django set up and every handler the worker registered, wherever. A
child never uses the worker's Redis client, queues or locks (a lock held by
another thread at the fork); its database connections are dropped unclosed.

What can happen to a child and what its job gets (docs/howto/process-pool.md):

* it replies: the reply becomes a ``Finished`` for the reporter and the
  job queued behind starts (its time limit too); past ``max_jobs_per_child``
  jobs or ``max_memory_per_child`` bytes of resident memory, it exits after
  that job (``pipes.leaves``) and a fresh child forks;
* its job passes its time limit (``Timeouts`` calls ``write_off``): the
  attempt fails as timed out at once, the child gets SIGTERM (its kill flag
  set first, so its ``finally`` blocks run) and SIGKILL ``TERM_GRACE_S``
  later if still there; a fresh child takes its place at once;
* it dies running a job (a segfault, ``os._exit``, the OOM killer): that
  attempt alone fails, naming the exit code or signal; a fresh child forks;
* the worker dies (SIGKILL too): every child ends itself at once (the EOF
  of a pipe only the worker writes), so no handler runs on beside a rerun;
* the job's handler is not registered: it fails unknown, without a child.
"""

from __future__ import annotations

import logging
import os
import pickle
import selectors
import signal
import threading
import time
from collections import deque

from ...core.exceptions import EchoMQError
from ...core.jobs import Job
from ...handlers import get_handler
from ..pool import unknown_name
from ..reporter import Finished
from . import child as child_module
from .pipes import NOTHING, Child, death_text, finished, frame, leaves, over_at_start, write_all

log = logging.getLogger("echomq_django.worker")

TERM_GRACE_S = 0.5  # SIGTERM to SIGKILL, for a child past its job's time limit (s)
# a job may queue in the pipe of a child whose last job ran under this (ms):
# the child reads it as it replies, without sleeping in between; a child of
# longer jobs takes a job only when idle (a job never waits behind a long one)
QUICK_MS = 1.0
DEPTH = 4  # jobs in a quick child's pipe at most: the running one and those behind
STALL_S = 0.05  # a queued job waits this long behind one at most while a child is idle (s)
SAFETY_S = 1.0  # the longest sleep while jobs wait for a child (s): a missed wake-up heals
QUEUE_MAX_BYTES = 1 << 14  # a bigger job goes to an idle child: no pipe fills with jobs
MIB = 1 << 20


class ProcessPool:
    """``size`` handler processes (see the module).

    ``name``: the supervisor thread's name; ``timeouts``: the worker's
    ``Timeouts`` (a job's limit starts when a child starts it);
    ``time_limits``: ``{queue: TIMEOUT_MS or None}``; ``source``: the
    worker's ``EchoMQ`` (a child's jobs read through its copy);
    ``max_jobs_per_child`` (count) and ``max_memory_per_child`` (bytes):
    recycling, None for none. ``start(job, done)``, ``write_off(job)``,
    ``resize(n)``, ``shutdown(wait)``; ``size``, ``pids()``, ``busy``,
    ``ahead`` (jobs it takes beyond ``size``), ``leaving``, ``recycled``
    (children sent away after their quota), ``replaced`` (died or killed)."""

    kind = "process"

    def __init__(
        self,
        size: int,
        name: str,
        *,
        timeouts,
        time_limits: dict,
        source=None,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
    ) -> None:
        self.size, self.name = size, name
        self._timeouts, self._limits, self._source = timeouts, time_limits, source
        self.max_jobs, self.max_rss = max_jobs_per_child, max_memory_per_child
        self._lock = threading.Lock()
        self._working: list[Child] = []  # in the pool: idle or running a job
        self._leaving: list[Child] = []  # killed or sent away, not reaped yet
        self._backlog: deque = deque()  # (job, done, message) waiting for a child
        self._warned: set[str] = set()
        self._said_memory = False  # over_at_start's WARNING, logged once
        self._closing = self._abandon = False
        self._asleep = False  # the supervisor thread waits in select: start() wakes it
        self.recycled = self.replaced = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lifeline = os.pipe()  # children end themselves at its EOF: this process died
        # every child's pipe and exit, and the wake-up: registered at the fork,
        # dropped at the reap (a selector per wait: a registration per child per job)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        with self._lock:
            self._top_up()
        self._thread = threading.Thread(target=self._supervise, name=name, daemon=True)
        self._thread.start()

    # -- called by the claiming loop and the time limits ----------------------
    def start(self, job: Job, done) -> None:
        """Run ``job``'s handler in a child; its ``Finished`` (or None, for
        an attempt already failed as timed out) goes to ``done``. The job
        waits in the pool until the supervisor thread writes it to a child,
        with any other job for that child in one write; that thread is woken
        only when it sleeps (a claim's jobs cost one wake-up, no write on
        the caller's thread)."""
        func = get_handler(job.name)
        if func is None:
            done.put(Finished(job, error=unknown_name(job, self._warned)))
            return
        message = (child_module.wire(job), child_module.handler_ref(func))
        body = frame(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        with self._lock:
            self._backlog.append((job, done, body))
            wake, self._asleep = self._asleep, False
        if wake:
            self._wake()

    def write_off(self, job: Job) -> str:
        """``job`` ran past its time limit: its child is ended (SIGTERM, then
        SIGKILL after ``TERM_GRACE_S``) and replaced at once. Returns what
        the timeout error says became of the handler."""
        with self._lock:
            ended = next((c for c in self._working if c.job is job), None)
            if ended is not None:
                self._working.remove(ended)
                self._leaving.append(ended)
                self._end(ended)
        if ended is not None:
            # not stuck: SIGKILL ends it within the grace whatever it does, so
            # max_stuck (a thread pool's way out) never stops this worker
            self._timeouts.settle(job)
        self._wake()
        return "its handler process was ended (SIGTERM, then SIGKILL)"

    def resize(self, size: int) -> None:
        """Run ``size`` (>= 1) children: more fork at once; idle ones beyond
        it are sent away (busy ones once their job is done)."""
        with self._lock:
            self.size = size
        self._wake()

    def pids(self) -> list[int]:
        """The pids of the children in the pool now (not those leaving)."""
        with self._lock:
            return [c.pid for c in self._working]

    @property
    def ahead(self) -> int:
        """Jobs the pool takes beyond one per child: one for each child
        whose last job ran under ``QUICK_MS`` (it waits in that child's
        pipe, docs/howto/process-pool.md#how-it-works)."""
        with self._lock:
            return sum(c.quick for c in self._working) * (DEPTH - 1)

    @property
    def leaving(self) -> int:
        """Children ended or sent away and not reaped yet."""
        with self._lock:
            return len(self._leaving)

    @property
    def busy(self) -> int:
        """Children running a job now."""
        with self._lock:
            return sum(c.job is not None for c in self._working)

    def shutdown(self, wait: bool) -> None:
        """Drop the jobs waiting for a child (their leases cover them); each
        child exits once its job is done. ``wait``: join them; else children
        still running a job are ended (SIGTERM, SIGKILL after the grace,
        waited for that long at most), as a thread pool's are when the
        process exits."""
        with self._lock:
            self._backlog.clear()
            self._closing, self._abandon = True, not wait
        self._wake()
        # without wait, within the grace: the process may exit right after,
        # and a child still in its job must be gone by then
        self._thread.join(None if wait else TERM_GRACE_S + 0.5)

    # -- the supervisor thread ------------------------------------------------
    def _supervise(self) -> None:
        while True:
            with self._lock:
                sends = self._tend()
                if self._closing and not self._working and not self._leaving:
                    break
                # asleep only once the backlog was looked at under the lock: a
                # job start() adds after this sees it set and wakes the thread
                self._asleep = not sends
                due = [c.kill_at for c in self._leaving if c.kill_at is not None]
                due += [time.monotonic() + SAFETY_S] if self._backlog else []  # a safety net
                if any(c.job is None for c in self._working):  # queued jobs may move there
                    due += [c.since + STALL_S for c in self._working if c.next]
                timeout = max(0.0, min(due) - time.monotonic()) if due else None
            if sends:  # outside the lock: a write may hand the CPU to the child
                for c, data in sends.items():
                    self._write(c, b"".join(data))
                continue  # tend again before sleeping: jobs may have come meanwhile
            replies, exits = [], []
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                else:
                    (replies if key.data[0] == "reply" else exits).append(key.data[1])
            for c in replies:
                self._read(c)
            for c in exits:  # after the replies: one sent before the exit counts
                self._reap(c)
        self._selector.close()
        for fd in (self._wake_r, self._wake_w, *self._lifeline):
            os.close(fd)

    def _tend(self) -> dict:
        """Under the lock: SIGKILL what outlived its grace, send away idle
        children beyond ``size`` (all of them when closing), fork up to
        ``size``, hand waiting jobs to children (``_slot``). Returns what
        to write to whom: ``{child: [framed messages]}``."""
        now = time.monotonic()
        for c in self._leaving:
            if c.kill_at is not None and now >= c.kill_at:
                c.proc.kill()
                c.kill_at = None
        for c in list(self._working):
            excess = self._closing or len(self._working) > self.size
            if c.job is None and excess:
                self._send_away(c, "")
            elif c.job is not None and self._closing and self._abandon:
                self._working.remove(c)
                self._leaving.append(c)
                self._end(c)
        if not self._closing:
            self._top_up()
        sends: dict[Child, list[bytes]] = {}
        for c in [c for c in self._working if c.next and now - c.since >= STALL_S]:
            back = c.take_back()  # behind a job that runs long: to idle children first
            while back and (idle := self._slot(False)) is not None:
                self._give(idle, *back.pop(0), sends)
            self._backlog.extendleft(reversed(back))
        while self._backlog:
            c = self._slot(len(self._backlog[0][2]) <= QUEUE_MAX_BYTES)
            if c is None:
                break
            self._give(c, *self._backlog.popleft(), sends)
        return sends

    def _read(self, c: Child) -> bool:
        """A child's pipe is readable: one read, then every whole message
        in it: its job's progress and log writes (``child.PipeWrites``) and
        its reply. Returns False at end-of-file (its death: ``_reap``)."""
        try:
            c.inbox.fill()
            alive = True
        except (EOFError, OSError):
            alive = False
        while (message := c.inbox.take()) is not NOTHING:
            self._handle(c, *message)
        return alive

    def _handle(self, c: Child, kind: str, value, ms, rss) -> None:
        """One message of ``c``'s (a write, or its job's reply)."""
        if kind == "write":
            self._relay(c, value, ms, rss)
            return
        with self._lock:
            job, done = c.job, c.done
            c.job = c.done = None
            if job is None or c.flag[0]:
                return  # killed past its time limit: the attempt was failed already
            c.jobs, c.quick = c.jobs + 1, ms < QUICK_MS
            why = leaves(c.jobs, rss, self.max_jobs, self.max_rss)
            if not self._said_memory and (said := over_at_start(c.jobs, rss, self.max_rss)):
                self._said_memory = True
                log.warning("%s", said)
            if why:  # it exits now, as the child applies the same rule
                self._send_away(c, why)
                while c.next:  # it will not read them: other children run them
                    self._backlog.appendleft(c.next.pop()[:3])
            elif c.next:  # the child reads it as this reply leaves
                c.job, c.done = c.next.popleft()[:2]
                c.since = time.monotonic()
                self._timeouts.start(c.job, c.job.timeout_ms or self._limits.get(c.job.queue))
        done.put(finished(job, kind, value, ms) if self._timeouts.settle(job) else None)

    def _relay(self, c: Child, job_id: str, progress: str | None, line: str | None) -> None:
        """A write of ``c``'s job goes to the worker's flusher, ahead of the
        reply after it; one refused earlier (the lease was lost) is answered
        on the pipe: the handler's next call raises it (``child.PipeWrites``)."""
        with self._lock:
            job = c.job
        if job is None or job.id != job_id or c.flag[0] or job._writes is None:
            return  # the attempt ended (its time limit): the write is late
        try:
            job._writes.put(job, progress, line)
        except EchoMQError as err:
            self._write(c, frame(pickle.dumps(("refused", job_id, err), 5)))

    def _reap(self, c: Child) -> None:
        """A child exited: a reply still in its pipe first, then its job (if
        any) fails with the exit code or signal; it leaves the pool."""
        while c.job is not None and not c.flag[0] and c.inbox.ready():
            if not self._read(c):  # its writes, then one reply per job at most
                break
        c.proc.join()
        code, ended = c.proc.exitcode, bool(c.flag[0])
        started = c.started()  # final: the child is gone
        self._selector.unregister(c.conn)
        self._selector.unregister(c.proc.sentinel)
        c.proc.close()  # its sentinel's descriptor goes now, not at a collection
        with self._lock:
            running = c.job, c.done
            c.job = c.done = None
            queued, unread = c.split(started)  # begun: failed as running ones
            if not self._closing:  # never begun: other children run them
                self._backlog.extendleft(reversed(unread))
            for where in (self._working, self._leaving):
                if c in where:
                    where.remove(c)
                    if where is self._working and not self._closing:
                        self.replaced += 1
            c.conn.close()  # on this thread, the only one that writes to it
            c.flag.close()
        if c.why:
            log.info("handler process %d recycled %s", c.pid, c.why)
        job, done = running
        if job is not None and (ended or not self._timeouts.settle(job)):
            done.put(None)  # ended past its time limit: failed already; the loop rechecks
            job = None
        dead = [] if job is None else [(job, done)]
        for job, done, *_ in dead + ([] if self._closing else queued):  # queued, begun
            error = death_text(c.pid, code)
            log.warning("job %s/%s (%s): %s", job.queue, job.id, job.name, error)
            done.put(Finished(job, error=error))

    # -- under the lock -------------------------------------------------------
    def _slot(self, may_queue: bool) -> Child | None:
        """The child to give a job to: one running a quick job with none
        queued behind and not due to be recycled after it (``may_queue``:
        the job is small enough to wait in a pipe; the child reads it as it
        replies, awake: no process is woken for it), else an idle one;
        None: the job waits."""
        idle = None
        for c in self._working:
            if c.job is None:
                idle = idle or c
            elif may_queue and c.quick and c.room(DEPTH, self.max_jobs):
                return c
        return idle

    def _give(self, c: Child, job: Job, done, body: bytes, sends: dict) -> None:
        """``c`` runs ``job`` from now on (its time limit starts), or right
        after its running job (``c.next``; the limit starts with the reply
        for that one); ``body`` is to be written to it (``sends[c]``)."""
        sends.setdefault(c, []).append(body)
        c.given += 1
        if c.job is None:
            c.job, c.done, c.since = job, done, time.monotonic()
            self._timeouts.start(job, job.timeout_ms or self._limits.get(job.queue))
        else:
            c.next.append((job, done, body, c.given))

    @staticmethod
    def _write(c: Child, data: bytes) -> None:
        """Write ``data`` (framed messages) to ``c``'s pipe, on the
        supervisor thread only; a child that died meanwhile is left to its
        exit (``_reap`` fails or re-routes its jobs)."""
        try:
            write_all(c.conn.fileno(), data)
        except (OSError, ValueError):
            pass

    def _send_away(self, c: Child, why: str) -> None:
        """``c`` finishes (it is idle) and exits; a fresh one forks if needed."""
        self._working.remove(c)
        self._leaving.append(c)
        c.why = why
        self._write(c, frame(pickle.dumps(None, 5)))
        if why:
            self.recycled += 1

    def _end(self, c: Child) -> None:
        """SIGTERM ``c`` (its kill flag set first, so it does not ignore
        it); SIGKILL follows after ``TERM_GRACE_S``."""
        c.flag[0] = 1
        c.kill_at = time.monotonic() + TERM_GRACE_S
        try:
            os.kill(c.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _top_up(self) -> None:
        while len(self._working) < self.size:
            self._working.append(self._fork())

    def _fork(self) -> Child:
        inherited = [self._wake_r, self._wake_w, self._lifeline[1]]
        for c in self._working + self._leaving:
            inherited += [c.conn.fileno(), c.proc.sentinel]
        c = Child.fork(child_module.main, f"{self.name}-child", inherited, self._source,
                       self._lifeline[0], (self.max_jobs, self.max_rss))  # fmt: skip
        self._selector.register(c.conn, selectors.EVENT_READ, ("reply", c))
        self._selector.register(c.proc.sentinel, selectors.EVENT_READ, ("exit", c))
        return c

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already (or the pool is closed)


def maker(source, max_jobs_per_child: int | None = None, max_memory_mb: int | None = None):
    """The ``make_pool(loop, name)`` a ``ClaimLoop`` calls at each run's
    start for a process pool of ``loop.concurrency`` children; ``source``:
    the worker's ``EchoMQ``; ``max_memory_mb`` in MiB (2**20 bytes)."""

    def make(loop, name: str) -> ProcessPool:
        return ProcessPool(
            loop.concurrency,
            name,
            timeouts=loop.timeouts,
            time_limits=loop.time_limits,
            source=source,
            max_jobs_per_child=max_jobs_per_child,
            max_memory_per_child=None if max_memory_mb is None else max_memory_mb * MIB,
        )

    return make
