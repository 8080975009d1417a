"""A handler process as the supervisor holds it, and reading its pipe
(docs/howto/process-pool.md#how-it-works).

Both ends write with ``multiprocessing.Connection.send_bytes``: a 4-byte
big-endian size (``-1`` then an 8-byte one past 2 GiB), then a pickle.
``Connection.recv`` reads a message in two system calls (the size, then
the body) and one message per wake-up; an ``Inbox`` reads whatever the pipe
holds in one call (up to ``CHUNK`` bytes) and hands out every whole message
in it: a job's progress writes and its reply, or the replies of a burst,
cost one read.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import select
import signal
import struct
from collections import deque

from ..reporter import Finished

CHUNK = 1 << 16  # bytes read per call
NOTHING = object()  # no whole message is buffered (a message may be None)
_SIZE, _BIG = struct.Struct("!i"), struct.Struct("!Q")
CONTEXT = multiprocessing.get_context("fork")
# in a child's shared flag: at 8 the number of the last job it began (it
# writes), at 16 the number up to which the worker took queued jobs back
BEGAN = TAKEN = struct.Struct("=Q")


def frame(body: bytes) -> bytes:
    """``body`` as ``Connection.send_bytes`` writes it: its size first."""
    if len(body) > 0x7FFFFFFF:
        return _SIZE.pack(-1) + _BIG.pack(len(body)) + body
    return _SIZE.pack(len(body)) + body


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (blocking): several framed messages
    in one call. Raises ``OSError`` as ``os.write`` does."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Inbox:
    """The messages waiting on one pipe end ``fd`` (a descriptor in
    blocking mode, owned by the caller; one reader thread at a time).
    ``fill()`` reads once, ``take()`` a whole buffered message,
    ``get(block)`` either, ``arrived()`` every message readable now.
    Raises ``EOFError`` at the end of the pipe (the writer died or closed
    it) and ``OSError`` as ``os.read`` does."""

    __slots__ = ("buf", "fd", "held")

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, bytearray()
        # messages read ahead by arrived() and not yet taken: a child's next
        # job, read while its handler looks for a refusal note
        self.held: deque = deque()

    def fill(self) -> None:
        """One read of what the pipe holds (blocks when it holds nothing)."""
        data = os.read(self.fd, CHUNK)
        if not data:
            raise EOFError("the other end of the pipe closed")
        self.buf += data

    def take(self):
        """The next whole buffered message (unpickled), or ``NOTHING``."""
        if self.held:
            return self.held.popleft()
        start, end = self._whole()
        if not end:
            return NOTHING
        message = pickle.loads(self.buf[start:end])
        del self.buf[:end]
        return message

    def ready(self) -> bool:
        """A whole message is buffered, or the pipe can be read without
        blocking (data, or its end)."""
        if self.held or self._whole()[1]:
            return True
        return bool(select.select([self.fd], [], [], 0)[0])

    def arrived(self) -> deque:
        """Every message that has fully arrived, without blocking, kept in
        order in ``held`` (returned: a caller removes the ones it handles;
        ``take`` gives the rest in order)."""
        kept = list(self.held)
        self.held.clear()
        while (message := self.get(block=False)) is not NOTHING:
            kept.append(message)
        self.held.extend(kept)
        return self.held

    def _whole(self) -> tuple[int, int]:
        """Where the first buffered message's pickle starts and ends; end 0
        while it is not all here."""
        buf = self.buf
        if len(buf) < 4:
            return 0, 0
        (size,) = _SIZE.unpack_from(buf)
        start = 4
        if size == -1:
            if len(buf) < 12:
                return 0, 0
            (size,), start = _BIG.unpack_from(buf, 4), 12
        return (start, start + size) if len(buf) >= start + size else (0, 0)

    def get(self, block: bool = True):
        """The next message; without ``block``, ``NOTHING`` when none has
        fully arrived."""
        while True:
            message = self.take()
            if message is not NOTHING:
                return message
            if not block and not select.select([self.fd], [], [], 0)[0]:
                return NOTHING
            self.fill()


def death_text(pid: int, code: int | None) -> str:
    """The error of a job whose handler process died under it: names the
    exit code, or the signal (a SIGKILL may be the out-of-memory killer)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"was ended by signal {name} ({-code})"
        if -code == signal.SIGKILL:
            why += " (the kernel's out-of-memory killer sends SIGKILL too)"
    else:
        why = f"exited with exit code {code}"
    return (
        f"HandlerProcessDied: the handler process (pid {pid}) {why} while it ran this job; "
        "a fresh handler process took its place"
    )


def over_at_start(jobs: int, rss: int, max_rss: int | None) -> str:
    """The WARNING a supervisor logs once when a handler process holds more
    than ``max_rss`` bytes (``max_memory_per_child``) after its first job
    (``jobs`` 1, ``rss`` bytes): a fresh child is about that large, so each
    would leave after one job and the pool fork for every job; "" otherwise
    (docs/howto/process-pool.md)."""
    if jobs != 1 or max_rss is None or rss <= max_rss:
        return ""
    return (
        f"a handler process held {rss / (1 << 20):.0f} MiB after its first job, over "
        f"max_memory_per_child ({max_rss / (1 << 20):.0f} MiB): a fresh process is about "
        "as large, so each leaves after one job and the pool forks for every job; set "
        "--max-memory-per-child above a fresh process's size"
    )


def leaves(jobs: int, rss: int, max_jobs: int | None, max_rss: int | None) -> str:
    """Why a handler process that has finished ``jobs`` jobs and holds
    ``rss`` bytes exits after its last reply (recycling, for the log), or
    "". The child and the supervisor apply this one rule to the same
    figures: the child exits without reading a job queued behind, and the
    supervisor hands that job to another child."""
    if max_jobs is not None and jobs >= max_jobs:
        return f"after {jobs} jobs (max_jobs_per_child)"
    if max_rss is not None and rss > max_rss:
        return (f"at {rss / (1 << 20):.0f} MiB resident (max_memory_per_child "
                f"{max_rss / (1 << 20):.0f} MiB)")  # fmt: skip
    return ""


def finished(job, kind: str, value, ms: float) -> Finished:
    """A child's reply ``(kind, value, ms, rss)`` for ``job`` as the
    reporter takes it (the kinds: ``child.py``)."""
    f = Finished(job, ms=ms)
    if kind == "ok":
        f.result = value
    elif kind == "postpone":
        f.postpone_ms = value
    elif kind == "wait":
        f.wait_children = True
    else:
        if type(value) is tuple:  # decided by the retry policy in the child
            value, f.delay_ms = value
        f.error, f.dead = value, kind == "dead"
    return f


class Child:
    """One handler process and what the supervisor knows of it: ``proc``
    (a ``multiprocessing`` process), ``conn`` (the worker's end of its
    pipe), ``flag`` (24 bytes it shares: its kill flag at 0, ``BEGAN`` and
    ``TAKEN``), ``gate`` (a lock both hold to read or write those two)."""

    __slots__ = ("conn", "done", "flag", "gate", "given", "inbox", "job", "jobs", "kill_at",
                 "next", "pid", "proc", "quick", "since", "why")  # fmt: skip

    def __init__(self, proc, conn, flag, gate) -> None:
        self.proc, self.conn, self.flag, self.gate, self.pid = proc, conn, flag, gate, proc.pid
        self.since = 0.0  # when its running job started (monotonic s)
        # the supervisor thread alone reads it and writes to it
        self.inbox = Inbox(conn.fileno())
        self.job = None  # running now
        self.done = None  # the run's queue of finished jobs, for this job
        # (job, done, framed message, its number among those given) written
        # to its pipe behind the running one, in order: each starts as the
        # child replies for the one before
        self.next: deque = deque()
        self.quick = False  # its last job ran under QUICK_MS: a job may queue behind
        self.jobs = 0  # jobs it finished
        self.given = 0  # jobs written to it
        self.kill_at: float | None = None  # SIGKILL due (monotonic) after a SIGTERM
        self.why = ""  # why it was sent away (recycling), for the log

    @classmethod
    def fork(cls, target, name: str, close_fds: list, *args) -> Child:
        """Start a handler process running ``target(conn, flag, close_fds
        + its pipe's other end, *args, gate)`` (``child.main``)."""
        parent_end, child_end = CONTEXT.Pipe(duplex=True)
        flag, gate = mmap.mmap(-1, 24), CONTEXT.Lock()  # shared (MAP_SHARED)
        fds = [*close_fds, parent_end.fileno()]
        proc = CONTEXT.Process(target=target, args=(child_end, flag, fds, *args, gate),
                               name=name, daemon=True)  # fmt: skip
        proc.start()
        child_end.close()
        return cls(proc, parent_end, flag, gate)

    def room(self, depth: int, max_jobs: int | None) -> bool:
        """A job may queue behind this child's: fewer than ``depth`` in its
        pipe, and it is not recycled after those (``max_jobs``)."""
        queued = len(self.next)
        return queued < depth - 1 and (max_jobs is None or self.jobs + 1 + queued < max_jobs)

    def split(self, started: int) -> tuple[list, list]:
        """Empty ``next`` (the child is gone, having begun ``started``
        jobs): ``(jobs begun, [(job, done, message)] never begun)``."""
        begun = [q for q in self.next if started >= q[3]]
        unread = [q[:3] for q in self.next if started < q[3]]
        self.next.clear()
        return begun, unread

    def take_back(self) -> list:
        """The queued jobs it has not begun, ``[(job, done, message)]``,
        taken out of ``next``; it will skip them (``TAKEN``, under ``gate``:
        it cannot begin one meanwhile). None while ``gate`` stays held."""
        if not self.gate.acquire(timeout=0.05):  # it died holding it (a SIGKILL): its reap
            return []
        try:
            taken = [q for q in self.next if q[3] > self.started()]
            if taken:
                TAKEN.pack_into(self.flag, 16, taken[-1][3])
        finally:
            self.gate.release()
        for q in taken:
            self.next.remove(q)
        return [q[:3] for q in taken]

    def started(self) -> int:
        """The number of the last job the child began (read once it has
        exited, or under ``gate``: a queued job it never began goes to
        another child)."""
        return BEGAN.unpack_from(self.flag, 8)[0]
