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

import os
import pickle
import select
import struct
import threading

CHUNK = 1 << 16  # bytes read per call
NOTHING = object()  # no whole message is buffered (a message may be None)
_SIZE, _BIG = struct.Struct("!i"), struct.Struct("!Q")


class Inbox:
    """The messages waiting on one pipe end ``fd`` (a descriptor in
    blocking mode, owned by the caller; one reader thread at a time).
    ``fill()`` reads once, ``take()`` a whole buffered message,
    ``get(block)`` either. Raises ``EOFError`` at the end of the pipe
    (the writer died or closed it) and ``OSError`` as ``os.read`` does."""

    __slots__ = ("buf", "fd")

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, bytearray()

    def fill(self) -> None:
        """One read of what the pipe holds (blocks when it holds nothing)."""
        data = os.read(self.fd, CHUNK)
        if not data:
            raise EOFError("the other end of the pipe closed")
        self.buf += data

    def take(self):
        """The next whole buffered message (unpickled), or ``NOTHING``."""
        start, end = self._whole()
        if not end:
            return NOTHING
        message = pickle.loads(self.buf[start:end])
        del self.buf[:end]
        return message

    def ready(self) -> bool:
        """A whole message is buffered, or the pipe can be read without
        blocking (data, or its end)."""
        return bool(self._whole()[1]) or bool(select.select([self.fd], [], [], 0)[0])

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


class Child:
    """One handler process and what the supervisor knows of it: ``proc``
    (a ``multiprocessing`` process), ``conn`` (the worker's end of its
    pipe), ``flag`` (its one-byte kill flag, shared)."""

    __slots__ = ("conn", "done", "flag", "inbox", "job", "jobs", "kill_at", "pid", "proc",
                 "sending", "why")  # fmt: skip

    def __init__(self, proc, conn, flag) -> None:
        self.proc, self.conn, self.flag, self.pid = proc, conn, flag, proc.pid
        self.inbox = Inbox(conn.fileno())  # the supervisor thread alone reads it
        # one writer at a time on its pipe: a job is written outside the pool's
        # lock (a pipe write may yield the CPU to the child it wakes; the
        # supervisor must not wait on the lock meanwhile to read other replies)
        self.sending = threading.Lock()
        self.job = None  # running now
        self.done = None  # the run's queue of finished jobs, for this job
        self.jobs = 0  # jobs it finished
        self.kill_at: float | None = None  # SIGKILL due (monotonic) after a SIGTERM
        self.why = ""  # why it was sent away (recycling), for the log
