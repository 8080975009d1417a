"""What runs inside a handler process (docs/howto/process-pool.md#how-it-works).

A child is forked from the worker with Django set up, the settings read and
every handler registered, so it starts in milliseconds. Right after the fork
it lets go of what it shares with the worker without touching it: the
database connections it inherited are dropped unclosed (closing one would
end the worker's session on the shared socket), the file descriptors of the
other children's pipes are closed (a child sees end-of-file when the worker
goes), and the process's ``EchoMQ`` is forgotten (``conf.reset()``: a handler
that adds jobs builds its own client; redis-py's pools start afresh in a new
pid).

Then it loops: read ``(fields, ref)`` from its pipe (a job as ``wire``
gives it, and its handler's ``handler_ref``; ``pipes.Inbox`` reads it; the
next may wait there already), count it begun, run the handler, write one
reply (pickled, ``send_bytes``). ``None`` (or end-of-file) ends the loop
and the process, as does its recycling quota after a reply. The reply is
a tuple ``(kind, value, ms, rss)``: ``kind`` is ``"ok"`` (``value`` the
result), ``"error"`` (the error text, or ``(text, delay ms)`` once the
retry policy decided it), ``"dead"`` (the same; the job fails for good:
``Unrecoverable``, a policy that does not retry it, or a result that cannot
leave the child)
or ``"postpone"`` (``value`` the ``RateLimited`` or ``MoveToDelayed`` delay
in ms) or ``"wait"`` (``WaitForChildren``; ``value`` None); ``ms`` is how
long the handler ran (ms), ``rss`` the child's resident memory after the job
(bytes; 0 without ``max_memory_per_child``: it is not read).

Signals: SIGINT is ignored (a terminal's Ctrl-C reaches the whole process
group; the worker decides how its jobs end). SIGTERM ends the child only
when the worker asked for it (it sets the child's kill flag first: a handler
past its time limit); a SIGTERM sent to every process of a service (systemd's
default ``KillMode=control-group``) is ignored, so a graceful stop lets the
running job finish, as on the thread pool.
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
import os
import pickle
import resource
import signal
import threading
import time

from django.db import connections

from ... import conf
from ...core.exceptions import MoveToDelayed, RateLimited, Unrecoverable, WaitForChildren
from ...core.jobs import Job
from ...handlers import get_handler, runs_sync
from ...tracing.spans import attempt
from ..pool import JobConnections, decided, error_text
from ..reporter import Finished
from .pipes import BEGAN, TAKEN, Inbox, leaves

_INHERITED: list = []  # the worker's DB connections, kept unclosed until os._exit
_KILL: list = [None]  # this child's kill flag (set by main)
# a Job's public fields, in order: its dataclass fields up to the private ones
WIRE = tuple(f.name for f in dataclasses.fields(Job) if not f.name.startswith("_"))
_FIELDS = operator.attrgetter(*WIRE)  # one C call for the tuple of them
_CONNECTIONS = JobConnections()  # Django's rule around each job, on this process's one thread
_STATM: list = [0, -1]  # (pid, fd) of this process's /proc/self/statm, opened on first use
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def handler_ref(func) -> str:
    """``"module:qualname"`` of a registered handler (the function under an
    ``async def`` handler's sync wrapper): how a child finds a handler its
    registry does not hold."""
    func = getattr(func, "__wrapped__", func)
    module = getattr(func, "__module__", None) or "?"
    return f"{module}:{getattr(func, '__qualname__', repr(func))}"


def wire(job: Job) -> tuple:
    """``job`` as it crosses the pipe: the values of its public fields, in
    their order (a tuple pickles and loads in a fraction of a dataclass's
    time); ``Job(*values)`` in the child builds it back, with no client, no
    cache and no writes of the worker's."""
    return _FIELDS(job)


def rss_bytes() -> int:
    """This process's resident memory now (bytes): ``/proc/self/statm`` on
    Linux (kept open per process and read again from its start: an open
    per job cost as much as a trivial handler), else its peak
    (``getrusage``, KiB there)."""
    try:
        pid, fd = _STATM
        if pid != os.getpid():  # a fork: /proc/self was the parent's at the open
            fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            _STATM[:] = os.getpid(), fd
        return int(os.pread(fd, 256, 0).split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(conn, kill_flag, close_fds, source, lifeline: int, limits, gate) -> None:
    """The child's life (``multiprocessing`` target, fork context):
    ``conn`` its end of the pipe, ``kill_flag`` a shared one-byte map the
    worker sets before a SIGTERM meant for this child, ``close_fds`` the
    inherited descriptors to close, ``source`` the worker's ``EchoMQ`` (a
    job's lazy reads, e.g. ``children_values()``, go through the child's
    copy of it), ``lifeline`` the read end of a pipe whose only writer is
    the worker: its EOF means the worker died, and the child ends at once;
    ``limits``: ``(max jobs, max resident bytes)`` (None: none), after
    which it exits right after its reply, leaving unread a job queued
    behind (``pipes.leaves``: the worker hands that job to another child);
    ``gate``: the lock it holds to count a job begun, or to skip one the
    worker took back (``pipes.Child.take_back``)."""
    _KILL[0] = kill_flag
    _after_fork(kill_flag, close_fds)
    threading.Thread(target=_die_with_the_worker, args=(lifeline,), daemon=True).start()
    inbox, jobs, seen = Inbox(conn.fileno()), 0, 0  # replies sent; jobs read
    while True:
        try:
            item = inbox.get()
        except (EOFError, OSError):
            return  # the worker is gone
        if item is None:
            return
        if isinstance(item[0], str):
            continue  # ("refused", ...) for a job that has ended meanwhile
        seen += 1
        with gate:  # a queued job begun is no longer re-routed
            if seen <= TAKEN.unpack_from(kill_flag, 16)[0]:
                continue  # taken back: another child runs it
            BEGAN.pack_into(kill_flag, 8, seen)
        job = Job(*item[0])
        ref = item[1]
        job._mq, job._writes = source, PipeWrites(conn, inbox, job.id)
        reply = run_one(job, ref, source, measure=limits[1] is not None)
        try:
            with job._writes.lock:  # a thread the handler left may still write
                job._writes.ended = True
                conn.send_bytes(pickle.dumps(reply, pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("dead", f"PayloadError: the result cannot leave the handler process: "
                       f"{type(exc).__name__}: {exc}", reply[2], reply[3]))  # fmt: skip
        except (BrokenPipeError, OSError):
            return
        jobs += 1
        if kill_flag[0] or leaves(jobs, reply[3], *limits):
            return  # asked to go while the handler ran (it caught the SIGTERM), or recycled


class PipeWrites:
    """A running job's ``_writes`` in a handler process (core/live.py
    ``Reporting``): each checked progress value or log line goes up the
    pipe as ``("write", job id, progress, line)``, ahead of the job's reply,
    and the supervisor hands it to the worker's flusher (the same path as
    on the thread pool). A ``("refused", job id, error)`` the supervisor
    sent back (an earlier write was refused: the lease was lost) is read
    before each write and raised. Thread-safe (a handler may write from
    threads of its own)."""

    def __init__(self, conn, inbox: Inbox, job_id: str) -> None:
        self.conn, self.inbox, self.job_id, self.error = conn, inbox, job_id, None
        self.lock = threading.Lock()
        self.ended = False  # the reply is sent: a late write is dropped

    def put(self, job, progress: str | None, line: str | None, block: bool = True) -> bool:
        with self.lock:
            if self.ended:
                return True
            if self.error is None:
                held = self.inbox.arrived()  # the next job stays there, for the loop
                for note in [m for m in held if m is not None and isinstance(m[0], str)]:
                    held.remove(note)
                    if note[1] == self.job_id:
                        self.error = note[2]
            if self.error is not None:
                raise type(self.error)(*self.error.args)
            self.conn.send_bytes(pickle.dumps(("write", self.job_id, progress, line), 5))
        return True


def _die_with_the_worker(lifeline: int) -> None:
    """Block on ``lifeline`` until the worker's end closes (it never writes:
    the worker died, by SIGKILL too), then SIGKILL this process: a handler
    whose worker is gone must not run on while another worker, once the
    lease lapsed, runs the same job (docs/howto/process-pool.md#how-it-works)."""
    while os.read(lifeline, 1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _after_fork(kill_flag, close_fds) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_term(signum, frame):
        if kill_flag[0]:
            raise SystemExit(f"the worker ended this handler process (signal {signum})")

    signal.signal(signal.SIGTERM, on_term)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    for alias in connections:
        db = connections[alias]
        if db.connection is not None:
            _INHERITED.append(db.connection)  # never closed here: the worker's socket
            db.connection = None
    conf.reset()


def _find(name: str, ref: str):
    """The handler of job ``name`` as the worker has it (``ref``): this
    process's registered one when it is the same function, else imported
    by its module and qualified name. Raises ``ImportError`` (or what the
    import raised) when it cannot be found here."""
    func = get_handler(name)
    if func is not None and handler_ref(func) == ref:
        return func
    module, _, qualname = ref.partition(":")
    if "<locals>" in qualname:
        raise ImportError(
            f"the handler of job name {name!r} ({ref}) is a nested function: a handler "
            "process cannot import it (define it at the top of a module)"
        )
    obj = importlib.import_module(module)  # its @handler may register it here
    func = get_handler(name)
    if func is not None and handler_ref(func) == ref:
        return func
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return runs_sync(obj)


def run_one(job, ref: str, source=None, measure: bool = True) -> tuple:
    """Run the handler of ``job`` (found by ``ref``); the reply tuple (see
    the module). A failed attempt is decided here, by the job's retry policy
    with the exception in hand (docs/howto/retries.md; ``source``'s queue
    settings): its value is then ``(error text, delay ms or None)``. Never
    raises but for ``SystemExit`` from the worker's kill. ``measure``:
    read the resident memory (else 0: no ``max_memory_per_child``)."""
    started = time.perf_counter()
    try:
        _CONNECTIONS.before()
        try:
            func = _find(job.name, ref)
        except Exception as exc:
            text = error_text(exc, below_caller=True)
            head = f"{type(exc).__name__}: the handler of job name {job.name!r} ({ref}) " \
                   "cannot be imported in the handler process: "  # fmt: skip
            kind, value = "error", head + text.split(": ", 1)[-1]
        else:
            kind, value = "ok", attempt(func, job)  # in a span when traced
    except Unrecoverable as exc:
        kind, value = "dead", error_text(exc, below_caller=True)
    except RateLimited as exc:
        kind, value = "postpone", exc.retry_after_ms
    except MoveToDelayed as exc:  # a step job (docs/howto/step-jobs.md)
        kind, value = "postpone", exc.delay_ms
    except WaitForChildren:
        kind, value = "wait", None
    except BaseException as exc:
        if isinstance(exc, SystemExit) and _KILL[0] is not None and _KILL[0][0]:
            raise  # the worker's SIGTERM: this process ends (the attempt was failed)
        kind, value = "error", error_text(exc, below_caller=True)
        if source is not None:
            f = decided(Finished(job, error=value), exc, source.queues, source.wire.backoff_cap_ms)
            kind, value = ("dead" if f.dead else "error"), (f.error, f.delay_ms)
    finally:
        try:
            _CONNECTIONS.after()
        except Exception:
            pass
    return kind, value, (time.perf_counter() - started) * 1000, rss_bytes() if measure else 0
