"""What a running job tells its callers: its progress and its job log
(docs/explanation/protocol.md#progress-and-log-lines).

The bounds and the checks a value passes before any Redis write, and
``Reporting``, the methods a handler calls on its ``Job``
(``job.report_progress(50)``, ``job.log("resized 3 of 8")``). The job
reaches Redis through the ``EchoMQ`` that claimed it (``Job._mq``, its
``progress`` part), under the lease the claim granted. A Django ``@task``
gets no ``Job``: ``current_job()`` answers it while the task runs
(docs/howto/progress-and-logs.md#from-a-django-task). ``step_prefix``
names the children a step job adds (docs/explanation/protocol.md#step-jobs).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
from contextvars import ContextVar
from typing import Any

from .exceptions import JobNotActive, MoveToDelayed

MAX_PROGRESS_BYTES = 1024  # bytes of JSON a progress value takes at most
MAX_LOG_LINE_BYTES = 2048  # bytes of UTF-8 a job log line takes at most (marker included)
KEEP_LOGS = 100  # lines a job log keeps by default (the queue's KEEP_LOGS)
PROGRESS_RULE = (
    f"progress is a number from 0 to 100 or a JSON object of at most {MAX_PROGRESS_BYTES} bytes"
)
CUT_MARKER = " [... {n} bytes cut]"  # ends a line cut to MAX_LOG_LINE_BYTES
MAX_ADDED_CHILDREN = 10_000  # direct children one add_children call adds at most

_current: ContextVar[Any] = ContextVar("echomq_current_job", default=None)


def step_prefix(queue: str, job_id: str, created_at: int | None, waits: int, call: int) -> str:
    """The prefix of the generated ids of one ``add_children`` call
    (docs/explanation/protocol.md#step-jobs): 12 URL-safe characters, the
    first 72 bits of the SHA-256 of the running job's ``queue``,
    ``job_id``, ``created_at`` (ms; None for a row without one), ``waits``
    (its row's ``waits``: the runs it ended in a wait, or in a move once it
    had children) and ``call`` (0 for the run's first ``add_children``
    call, then 1, ...). The run repeated after a crash draws the same ids,
    so it adds the same children again instead of new ones; another job, a
    later run after a wait, or a job added again under the same id (a new
    ``created_at``) draws others."""
    text = f"{queue}\0{job_id}\0{created_at or ''}\0{waits}\0{call}"
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:9]).decode()


def progress_text(value: Any, encode=None) -> str:
    """``value`` as the JSON text the job row keeps: a number from 0 to 100
    (int or float, finite; not a bool) or a dict that encodes (with
    ``encode``, a callable returning JSON text; plain ``json`` when None) to
    at most ``MAX_PROGRESS_BYTES`` bytes. Raises ``ValueError`` naming the
    rule (``PayloadError`` is one, raised by the caller's encoder for a dict
    that does not encode) before any write."""
    if type(value) is int and 0 <= value <= 100:  # the usual value, checked at once
        return int.__repr__(value)
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        raise ValueError(f"progress {value!r}: {PROGRESS_RULE}")
    if not isinstance(value, dict):
        if not 0 <= value <= 100 or not math.isfinite(value):  # an int of 400 digits too
            raise ValueError(f"progress {value!r}: {PROGRESS_RULE}")
        # json.dumps' own text for a number, without its encoder's set-up
        return int.__repr__(value) if isinstance(value, int) else float.__repr__(value)
    text = encode(value) if encode is not None else json.dumps(value, separators=(",", ":"))
    size = len(text.encode())
    if size > MAX_PROGRESS_BYTES:
        raise ValueError(f"progress is {size} bytes of JSON: {PROGRESS_RULE}")
    return text


def log_line(line: Any) -> str:
    """``line`` (a ``str``) as the job log keeps it: a line over
    ``MAX_LOG_LINE_BYTES`` bytes of UTF-8 is cut on a character boundary
    and ends with ``CUT_MARKER`` naming the bytes cut (never refused
    silently). Raises ``TypeError`` for a line that is not a ``str`` and
    ``ValueError`` for one that does not encode (a lone surrogate)."""
    if type(line) is str and line.isascii() and len(line) <= MAX_LOG_LINE_BYTES:
        return line  # the usual line, checked without an encode
    if not isinstance(line, str):
        raise TypeError(f"a job log line is a str, got {type(line).__name__}")
    try:
        raw = line.encode()
    except UnicodeEncodeError as err:
        raise ValueError(f"a job log line must encode as UTF-8: {err}") from None
    if len(raw) <= MAX_LOG_LINE_BYTES:
        return line
    room = MAX_LOG_LINE_BYTES - len(CUT_MARKER.format(n=len(raw)).encode())
    head = raw[:room].decode(errors="ignore")  # a character cut in two is dropped
    return head + CUT_MARKER.format(n=len(raw) - len(head.encode()))


def current_job() -> Any:
    """The ``Job`` whose handler (or Django ``@task``) runs in this context,
    or None outside one; docs/howto/progress-and-logs.md#from-a-django-task."""
    return _current.get()


def running(job: Any):
    """Mark ``job`` as this context's ``current_job()``; returns the token
    the caller hands to ``stop_running`` when the job's call ends."""
    return _current.set(job)


def stop_running(token) -> None:
    """Undo the ``running`` call that returned ``token``."""
    _current.reset(token)


class Reporting:
    """The ``Job`` methods a handler calls while it runs
    (docs/howto/progress-and-logs.md#when-a-write-is-visible). Each checks
    its value on the host at once (a bad one raises, nothing is written).
    In a worker the call then returns without a round trip: the worker
    sends its handlers' writes pipelined, each under the job's lease, and
    always before it reports the job finished (runners/flusher.py). A write
    the script refuses (the lease was lost, the job is no longer active) is
    dropped and logged, and a later call of the same job raises that error
    (``LeaseLost``, ``JobNotActive`` or ``JobNotFound``). A job outside a
    worker (``mq.claim`` by hand) writes at once and raises at once."""

    def report_progress(self, value: Any) -> None:
        """Set the job's progress to ``value`` (a number 0-100 or a small
        JSON object, ``PROGRESS_RULE``), read back by ``get_job().progress``
        and written to the queue's events stream. Raises ``PayloadError``
        for a bad value, before any write; ``LeaseLost``, ``JobNotActive``
        (an earlier write was refused, see the class); ``RedisUnavailable``
        (outside a worker only)."""
        if not self.lease:
            self._claimed("report_progress")
        if type(value) is int and 0 <= value <= 100 and self._writes is not None:
            self._writes.put(self, int.__repr__(value), None)  # the usual call, in a worker
        else:
            self._write(self._require_mq().progress.progress_text(value), None)
        self.progress = value

    def log(self, line: str) -> None:
        """Append ``line`` to the job's log (the newest ``KEEP_LOGS`` lines
        kept; a line over ``MAX_LOG_LINE_BYTES`` is cut, with a marker).
        Raises ``TypeError`` for a line that is not a str, before any
        write; ``LeaseLost``, ``JobNotActive`` (an earlier write was
        refused, see the class); ``RedisUnavailable`` (outside a worker
        only)."""
        if not self.lease:
            self._claimed("log")
        if type(line) is str and line.isascii() and len(line) <= MAX_LOG_LINE_BYTES:
            text = line  # the usual line: nothing to cut, and it encodes (log_line's own check)
        else:
            text = self._require_mq().progress.log_line(line)
        if self._writes is not None:
            self._writes.put(self, None, text)
        else:
            self._write(None, text)

    def _write(self, progress: str | None, line: str | None, block: bool = True) -> bool:
        """Hand checked values to the worker's writes (``_writes``), or
        write them now. ``block``: wait for room when the worker holds its
        bound of unsent writes; without it, returns False instead (nothing
        taken)."""
        if self._writes is not None:
            return self._writes.put(self, progress, line, block)
        as_list = lambda v: [] if v is None else [v]  # noqa: E731
        self._require_mq().progress.write(self, as_list(progress), as_list(line))
        return True

    def logs(self, start: int = 0, end: int = -1) -> list[str]:
        """The job log's lines ``start`` .. ``end`` (inclusive, negative
        from the end): ``EchoMQ.job_logs``."""
        return self._require_mq().job_logs(self.queue, self.id, start, end)

    # -- step jobs (docs/howto/step-jobs.md) --------------------------------
    def update_payload(self, payload: Any) -> None:
        """Replace the job's stored payload with ``payload`` (any JSON value,
        at most ``max_payload_bytes`` of JSON): the job's next run (after
        ``move_to_delayed``, its children, or a retry) reads it, and so does
        ``self.payload`` now. Raises ``PayloadError`` for a value that does
        not encode or is too big (nothing written); ``LeaseLost``,
        ``JobNotActive`` (nothing written); ``RedisUnavailable``.
        docs/howto/step-jobs.md#update-the-payload"""
        self._claimed("update_payload")
        self._require_mq().progress.update_payload(self, payload)
        self.payload = payload

    def move_to_delayed(self, delay_ms: int):
        """End this attempt and run the job again in ``delay_ms`` ms (int,
        0 to ten years), with its payload as ``update_payload`` left it: not
        a failure, and the attempt does not count. Raises ``MoveToDelayed``,
        always: let it leave the handler, and the worker moves the job under
        its lease (``lua/postpone.lua``). ``TypeError`` / ``ValueError`` for a
        bad delay; ``JobNotActive`` for a job not claimed here (a ``Job``
        from ``get_job``). docs/howto/step-jobs.md#move-to-delayed"""
        self._claimed("move_to_delayed")
        raise MoveToDelayed(delay_ms)

    def _claimed(self, call: str) -> None:
        """Raise ``JobNotActive`` unless this ``Job`` holds its claim's
        lease token: a ``Job`` read with ``get_job`` has none (a read is not
        the claim), so only the running job's own calls write."""
        if not self.lease:
            raise JobNotActive(
                f"{call}: job {self.queue}/{self.id} is not a job this process claimed "
                "(a Job read with get_job holds no lease); call it from the job's handler"
            )

    def add_children(self, children: list) -> list:
        """Add ``children`` (a list of ``Flow`` nodes, any queue, each
        possibly with children of its own; at most ``MAX_ADDED_CHILDREN``)
        as this running job's children, landed now, parent first; then
        ``raise emq.WaitForChildren`` to end the attempt held until they
        resolve. Returns their ``JobRef``\\ s. Ids left out are derived
        from this job and call (``step_prefix``): the run after a crash
        must add the same children in the same order, and then adds them
        once. Refused, nothing written: a
        job that is not running or whose lease was lost (``JobNotActive``,
        ``LeaseLost``), a bad node (``FlowError``, ``ValueError``,
        ``PayloadError``), an id taken (``FlowConflict``).
        docs/howto/step-jobs.md#add-children-and-wait"""
        return self._require_mq().flows.add_children(self, children)

    async def aupdate_payload(self, payload: Any) -> None:
        """``update_payload`` for an ``async def`` handler (on a thread)."""
        await asyncio.to_thread(self.update_payload, payload)

    async def aadd_children(self, children: list) -> list:
        """``add_children`` for an ``async def`` handler (on a thread)."""
        return await asyncio.to_thread(self.add_children, children)

    async def areport_progress(self, value: Any) -> None:
        """``report_progress`` for an ``async def`` handler: in a worker it
        returns at once as the sync call does (on a thread only while the
        worker waits for room); outside one the write runs on a thread."""
        self._claimed("areport_progress")
        text = self._require_mq().progress.progress_text(value)
        if self._writes is None or not self._write(text, None, block=False):
            await asyncio.to_thread(self._write, text, None)
        self.progress = value

    async def alog(self, line: str) -> None:
        """``log`` for an ``async def`` handler (as ``areport_progress``)."""
        self._claimed("alog")
        text = self._require_mq().progress.log_line(line)
        if self._writes is None or not self._write(None, text, block=False):
            await asyncio.to_thread(self._write, None, text)
