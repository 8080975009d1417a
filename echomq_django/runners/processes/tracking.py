"""The supervisor's view of each handler process (``Child``) and the error a
job gets when its handler process dies under it (``death_text``)
(docs/howto/process-pool.md#a-handler-process-that-dies).
"""

from __future__ import annotations

import signal
import threading
from collections import deque

from ...core.jobs import Job


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


class Child:
    """One handler process and what the supervisor knows of it: ``proc``
    (its ``multiprocessing.Process``), ``conn`` (the worker's end of its
    pipe), ``flag`` (its one-byte kill flag), the job it runs and those it
    holds next, its job count and its pending SIGKILL."""

    __slots__ = ("conn", "done", "flag", "job", "jobs", "kill_at", "next", "pid", "proc",
                 "sending", "why")  # fmt: skip

    def __init__(self, proc, conn, flag) -> None:
        self.proc, self.conn, self.flag, self.pid = proc, conn, flag, proc.pid
        self.job: Job | None = None  # running now
        self.done = None  # the run's queue of finished jobs, for this job
        self.next: deque = deque()  # (job, done) sent after it, in its pipe: not started
        # held from a job's hand-over (under the pool's lock) until its write is done
        # (outside it): writes to one child keep the order of the hand-overs
        self.sending = threading.Lock()
        self.jobs = 0  # jobs it finished
        self.kill_at: float | None = None  # SIGKILL due (monotonic) after a SIGTERM
        self.why = ""  # why it was sent away (recycling), for the log

    def write(self, data: bytes | None) -> None:
        """Write ``data`` (a pickled job; None: leave) to its pipe, then
        release ``sending`` (taken at the hand-over). A dead child's error
        is ignored: its exit fails its job."""
        try:
            if data is None:
                self.conn.send(None)
            else:
                self.conn.send_bytes(data)
        except (OSError, ValueError):
            pass
        finally:
            self.sending.release()
