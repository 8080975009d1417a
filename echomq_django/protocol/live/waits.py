"""``mq.waits``: block until a job finishes, without polling
(docs/explanation/protocol.md#waiting-for-a-result).

A waiter's ``wait_mark`` script (lua/wait_mark.lua) reads the job's state and the point to
block from in the job's stream ``P:{q}:done:<id>`` at one time: the last
entry's id of a stream another waiter made, or a ``wait`` entry that makes
the stream (its expiry a little past the wait). A job finished before is
answered at once; one finishing after finds the stream and appends a
``completed`` / ``dead`` / ``cancelled`` entry (lua/lib/flow.lua ``emit``,
in the script that finishes it), which every waiter's ``XREAD BLOCK`` from
its point sees. A new waiter writes nothing to a stream that exists, so the
waiters blocked on it do not wake for it. The row's ``HGETALL`` is
pipelined behind each block, so Redis answers it as the block wakes: the
finished job comes back in the wake's own round trip.
"""

from __future__ import annotations

import math
import threading
import time

from ...core.exceptions import JobDead, JobNotFound
from ...core.jobs import Job, JobState, to_text
from ...core.refs import JobRef
from ..scripts import socket_timeout
from ..wire import Part
from .blocking import Cancel, long_block, unblocked

WAIT_SLACK_MS = 5_000  # the done stream outlives the longest wait on it by this (ms)
DONE_MAXLEN = 64  # entries a done stream keeps, about (waiters' marks and the finish)
SOCKET_MARGIN_S = 1.0  # each XREAD BLOCK ends this much before the socket timeout (s)
MAX_WAIT_S = 365 * 86_400  # the longest finite wait (s); None waits without an end
LONG_BLOCK_S = 300.0  # one XREAD BLOCK of a wait lasts at most this (s)
STREAM_TTL_MS = 3_600_000  # a done stream's expiry is renewed to this ahead while waited on (ms)
FINISHED = {JobState.COMPLETED.value, JobState.DEAD.value}
GONE = "finished and was removed (retention, or a remove) before this wait read it"


def check_timeout(timeout_s: object) -> float | None:
    """``timeout_s`` as a float if it is a finite number of seconds from 0
    to ``MAX_WAIT_S``, or None (wait until the job finishes); ``ValueError``
    naming the rule otherwise (a bool is refused)."""
    if timeout_s is None:
        return None
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not ok or not math.isfinite(timeout_s) or not 0 <= timeout_s <= MAX_WAIT_S:
        raise ValueError(
            f"invalid timeout_s {timeout_s!r}: a wait is None (until the job finishes) "
            f"or a number of s from 0 to {MAX_WAIT_S:,}"
        )
    return float(timeout_s)


def _removed(entries: list) -> bool:
    """Whether a done stream's new entries hold the note of a removal."""
    return any(to_text(f.get(b"e", f.get("e"))) == "removed" for _, f in entries)


class Waits(Part):
    """Waiting for a job's result; ``reads`` is the ``EchoMQ`` whose
    ``get_job`` answers the finished job."""

    def __init__(self, wire, reads) -> None:
        super().__init__(wire)
        self.reads = reads

    def _finished(self, ref: JobRef) -> Job:
        """The job once its finish was seen; ``JobNotFound`` if it is gone."""
        try:
            return self.reads.get_job(ref.queue, ref.id)
        except JobNotFound:
            raise JobNotFound(f"job {ref.id!r} in queue {ref.queue!r} {GONE}") from None

    def wait(
        self, ref: JobRef, timeout_s: float | None, cancel: Cancel | threading.Event | None = None
    ) -> Job:
        """Block until the job ``ref`` (a ``JobRef``) finishes, at most
        ``timeout_s`` s (a number from 0 to ``MAX_WAIT_S``; 0 checks once;
        None waits until it finishes), and return it as a ``Job`` when it
        completed (``job.result`` its result). ``cancel``: set from another
        thread, it ends the wait with ``TimeoutError``: a ``blocking.Cancel``
        at once (``await_result``'s), a ``threading.Event`` at its next block
        (within the client's socket timeout).

        Raises ``ValueError`` for a bad timeout (before any Redis I/O);
        ``JobNotFound`` at once for an unknown id, and when the row is gone
        by the time the wait wakes (it finished and retention removed it, or
        it was removed: a removal wakes the waiters); ``JobDead`` (``.job``,
        ``.error``) when it ended dead, cancelled included; builtin
        ``TimeoutError`` after ``timeout_s``; ``RedisUnavailable``. One
        block lasts up to ``LONG_BLOCK_S`` (300 s), its reply read past the
        client's socket timeout, so a blocked wait costs two Redis commands
        per block and needs no special client.
        docs/howto/wait.md#what-a-wait-costs"""
        timeout_s = check_timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        k = self.keys.queue(ref.queue)
        done, row = k.done(ref.id), k.job(ref.id)
        ttl_ms = STREAM_TTL_MS if timeout_s is None else int(timeout_s * 1000)
        ttl_ms = min(ttl_ms, STREAM_TTL_MS) + WAIT_SLACK_MS
        # the point to block from and the state, at one time: a finish after
        # it finds the stream and notes it after that point
        last, *state = self.scripts.run("wait_mark", [done, row], [ttl_ms, DONE_MAXLEN])
        state = state[0] if state else None
        if state is None:
            raise JobNotFound(f"job {ref.id!r} not found in queue {ref.queue!r}")
        # a wait no longer than the stream's expiry never renews it
        renews = timeout_s is None or timeout_s * 1000 > STREAM_TTL_MS
        renew_at = time.monotonic() + (ttl_ms - WAIT_SLACK_MS) / 2000 if renews else math.inf
        cut = socket_timeout(self.client)
        slice_s = None  # a block read the ordinary way ends before the socket timeout
        if cut:
            slice_s = cut - SOCKET_MARGIN_S if cut > 2 * SOCKET_MARGIN_S else cut / 2
        job = None
        while to_text(state) not in FINISHED:
            left = math.inf if deadline is None else deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                if not self.client.exists(row):
                    raise JobNotFound(f"job {ref.id!r} in queue {ref.queue!r} was removed")
                raise TimeoutError(
                    f"job {ref.id!r} in queue {ref.queue!r} did not finish in {timeout_s} s"
                    if left <= 0
                    else f"the wait for job {ref.id!r} in queue {ref.queue!r} was cancelled"
                )
            commands = []
            if time.monotonic() >= renew_at:  # a long wait keeps its stream alive
                commands.append(("PEXPIRE", done, ttl_ms, "GT"))
                renew_at = time.monotonic() + (ttl_ms - WAIT_SLACK_MS) / 2000
            # a block lasts up to LONG_BLOCK_S, its reply read past the socket
            # timeout (blocking.long_block); a wait with a plain Event for its
            # cancel blocks one socket-timeout slice at a time, to see its flag
            block = min(left, LONG_BLOCK_S, renew_at - time.monotonic())
            sliced = cancel is not None and not isinstance(cancel, Cancel)
            if sliced:
                block = min(block, slice_s or math.inf)
            block_ms = max(1, int(block * 1000))
            # the row's read rides behind the block: Redis runs it as the XREAD
            # wakes, after the script that finished the job, so a wake costs
            # no second round trip
            commands.append(
                ("XREAD", "COUNT", DONE_MAXLEN, "BLOCK", block_ms, "STREAMS", done, last)
            )
            commands.append(("HGETALL", row))
            replies = None
            if not sliced:
                replies = long_block(self.client, done, commands, block, cancel)
            if replies is None and cancel is not None and cancel.is_set():
                continue  # cut by the cancel: the loop's top says so
            if replies is None:  # the ordinary way: the client's retries and routing
                # what is left now: a failed long block may have spent it all
                # (a stalled server: its read waited the block and 2 s more)
                left = math.inf if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    continue  # the loop's top ends the wait
                block_ms = max(1, int(min(block, left, slice_s or math.inf) * 1000))
                pipe = self.client.pipeline(transaction=False)
                if commands[0][0] == "PEXPIRE":
                    pipe.pexpire(done, ttl_ms, gt=True)
                pipe.xread({done: last}, count=DONE_MAXLEN, block=block_ms)
                pipe.hgetall(row)
                replies = pipe.execute(raise_on_error=False)
                if any(unblocked(reply) for reply in replies):
                    continue  # the block was ended, not the job: block again
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
            reply, fields = replies[-2:]
            if reply:
                # RESP2: [[key, entries]]; RESP3 (protocol=3): {key: [entries]}
                entries = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
                last = entries[-1][0]
            if not fields:
                why = GONE if reply and not _removed(entries) else "was removed"
                raise JobNotFound(f"job {ref.id!r} in queue {ref.queue!r} {why}")
            job = Job.from_row(ref.queue, ref.id, fields, mq=self.reads)
            state = job.state.value
        if job is None:
            job = self._finished(ref)
        if job.state is JobState.DEAD:
            raise JobDead(job)
        return job
