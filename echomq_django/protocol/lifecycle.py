"""The lifecycle of finished and unwanted jobs (docs/explanation/house.md, "protocol/"):
retention (``lua/prune.lua``), remove (``lua/remove.lua``), cancel
(``lua/cancel.lua``) and retry by id (``lua/retry.lua``; for a child its
parent on another slot ignored, ``lua/reattach_ignored.lua`` first).

Every step is one bounded Lua call (``prune``, ``remove``, ``cancel``; the
rules are in ``lua/lib/lifecycle.lua``): a call does at most ``budget`` units
of work (one per node or child ref touched; ``BUDGET`` = 200 is a few ms of
Redis time) and answers ``more`` when work is left, which the host drives
call after call. So a 10,000-child flow is removed or cancelled without any
one script holding Redis for long. A child on another slot is reached
through the outbox, like fan-in: the scripts return the entries they pushed
and the host delivers them at once and takes them out of the outbox
(``deliver_sent``: the pump does not deliver them a second time), then drives
the work those queues got.

``Lifecycle`` is the part ``mq.lifecycle``: the runners' timers call
``prune``; ``EchoMQ.remove``, ``cancel`` and ``retry`` hand their calls to
it.
"""

from __future__ import annotations

import json
import secrets
import warnings
from dataclasses import dataclass, field

from ..core.exceptions import (
    JobNotActive,
    JobNotCancellable,
    JobNotFound,
    JobNotRemovable,
    JobNotRetryable,
)
from ..core.jobs import JobState, Outcome
from ..core.refs import as_ref
from ..core.retention import Keep, retention
from ..core.rows import (
    PARENT,
    PARENT_INC,
    PARENT_QUEUE,
    POLICY,
    STATE,
    parent_link,
    pick_fields,
    row_fields,
)
from .errors import reports_redis_down
from .outbox import Outbox
from .wire import Part, Wire

BUDGET = 200  # units of work per script call: a few ms of Redis time at most
MAX_CALLS = 50  # prune calls per queue per timer tick (10,000 removals)


@dataclass
class Report:
    """What a lifecycle operation did: rows ``removed``, finished jobs
    ``held_back`` by their flow (retention keeps a finished node while its
    parent may still retry it: docs/explanation/lifecycle.md#flow-rules),
    script ``calls`` made, the ``state`` a cancel found (``active``:
    marked), and the ``Outcome`` of what else moved. ``held`` is the
    deprecated name of ``held_back`` ("held" names a parent awaiting its
    children: docs/explanation/glossary.md)."""

    removed: int = 0
    held_back: int = 0
    calls: int = 0
    more: bool = False
    state: JobState | None = None
    outcome: Outcome = field(default_factory=Outcome, repr=False)

    def add(self, wire: Wire, reply) -> list[str]:
        """Fold one script reply in; returns the entries it sent to other
        slots, as pushed (JSON texts)."""
        data = json.loads(reply)
        self.removed += data.get("removed") or 0
        self.held_back += data.get("held") or 0
        self.calls += 1
        self.more = bool(data.get("more"))
        self.outcome.merge(wire.outcome(reply))
        return list(data.get("sent") or [])

    @property
    def held(self) -> int:
        """Deprecated: ``held_back``."""
        warnings.warn(
            "Report.held is deprecated: read Report.held_back", DeprecationWarning, stacklevel=2
        )
        return self.held_back


class Lifecycle(Part):
    """The lifecycle part of ``EchoMQ`` (``mq.lifecycle``): ``prune``,
    ``remove``, ``cancel``, ``retry``. ``outbox`` delivers what their scripts
    send to other slots at once; ``reads`` answers a retried job's state."""

    def __init__(self, wire: Wire, outbox: Outbox, reads) -> None:
        super().__init__(wire)
        self.outbox = outbox
        self.reads = reads

    def retention(self, queue: str) -> tuple[Keep, Keep]:
        """``(completed, dead)`` retention rules of ``queue`` (its ``KEEP_*``
        settings, else the defaults)."""
        return retention(self.wire.queues.get(queue, {}))

    def _prune_call(self, queue: str, budget: int, mode: str, since: int | None = None):
        k = self.keys.queue(queue)
        completed, dead = self.retention(queue)
        now = self.clock()
        return (
            "prune",
            [k.completed, k.dead],
            [
                queue,
                k.base,
                now,
                budget,
                *completed.args(),
                *dead.args(),
                mode,
                now if since is None else since,
            ],
        )

    def prune(self, queue: str, budget: int = BUDGET, max_calls: int | None = MAX_CALLS) -> Report:
        """Run ``queue``'s lifecycle work: queued cancels and removals, jobs
        whose own keep ran out, then the queue's retention (oldest first,
        flow-aware); ``budget`` units per script call, calls until none is
        left or ``max_calls`` were made (None: no limit). Entries for other
        slots are delivered, and their queues' work driven the same way.
        Other queues reached through the outbox get their work lists driven
        (``mode`` 'lists'), not their retention.
        Returns the ``Report``. Raises ``ValueError`` for a bad queue name or
        ``KEEP_*`` setting, ``RedisUnavailable``. docs/explanation/lifecycle.md."""
        report = Report()
        self._drive({queue}, report, budget, max_calls, "all")
        return report

    def _drive(
        self, queues: set[str], report: Report, budget: int, max_calls: int | None, mode: str
    ) -> None:
        todo = [(q, mode) for q in sorted(queues)]
        while todo:
            queue, how = todo.pop(0)
            # rows held since this pass began are not looked at again
            calls, since = 0, self.clock()
            while max_calls is None or calls < max_calls:
                calls += 1
                call = self._prune_call(queue, budget, how, since)
                sent = report.add(self.wire, self.scripts.run(*call))
                if sent:
                    report.outcome.merge(self.outbox.deliver_sent(queue, sent))
                    reached = {json.loads(e)["q"] for e in sent} - {q for q, _ in todo}
                    todo.extend((q, "lists") for q in sorted(reached))
                if not report.more:
                    break

    def remove(self, queue, job_id: str | None = None, budget: int = BUDGET) -> Report:
        """Remove a job that is not active, with its whole subtree
        (docs/explanation/lifecycle.md#remove). A removed child resolves its parent like
        ``remove_dependency`` (the parent goes on; a parent on another slot
        through the outbox). Returns the ``Report`` (``removed`` rows on the
        job's queue). Raises ``JobNotFound``, ``JobNotRemovable`` (an active
        job: cancel it, or wait), ``ValueError`` for a bad name or ref,
        ``RedisUnavailable``. The job is ``(queue, job_id)`` or, with
        ``job_id`` None, a ``JobRef`` / ``(queue, id)`` / ``"queue/id"`` as
        ``queue``."""
        if job_id is None:
            queue, job_id = as_ref(queue, self.keys)
        k = self.keys
        report = Report()
        try:
            reply = self.scripts.run(
                "remove",
                [k.job(queue, job_id)],
                [queue, k.base(queue), job_id, self.clock(), budget, secrets.token_hex(8)],
            )
        except JobNotActive:
            raise JobNotRemovable(
                f"job {job_id!r} in queue {queue!r} is active; an active job is not "
                "removed (cancel it, or remove it once it finished)"
            ) from None
        self._follow_up(queue, report, report.add(self.wire, reply), budget)
        return report

    def cancel(self, queue, job_id: str | None = None, budget: int = BUDGET) -> Report:
        """Cancel a job and its unfinished subtree (docs/explanation/lifecycle.md): pending,
        delayed and awaiting jobs die now with the error 'cancelled' (their
        parent's policy applies); an active job is marked and dies when its
        worker reports or heartbeats, or its lease expires.
        ``Report.state`` is the state found. Raises ``JobNotFound``,
        ``JobNotCancellable`` (completed or dead), ``ValueError`` for a bad
        name or ref, ``RedisUnavailable``. The job is ``(queue, job_id)``
        or, with ``job_id`` None, a ``JobRef`` / ``(queue, id)`` /
        ``"queue/id"`` as ``queue``."""
        if job_id is None:
            queue, job_id = as_ref(queue, self.keys)
        k = self.keys
        report = Report()
        try:
            reply = self.scripts.run(
                "cancel",
                [k.job(queue, job_id)],
                [queue, k.base(queue), job_id, self.clock(), budget, secrets.token_hex(8)],
            )
        except JobNotActive as err:
            state = err.parts[2] if len(err.parts) > 2 else "finished"
            raise JobNotCancellable(
                f"job {job_id!r} in queue {queue!r} is {state}; only a pending, delayed, "
                "awaiting or active job can be cancelled"
            ) from None
        sent = report.add(self.wire, reply)
        report.state = JobState(json.loads(reply)["state"])
        self._follow_up(queue, report, sent, budget)
        return report

    def _reattach_ignored(self, queue: str, job_id: str) -> dict | None:
        """Before retrying a dead child whose parent on another slot ignored
        it (``id``): re-count it on the parent's slot, or refuse there, in one
        step (``lua/reattach_ignored.lua``), so no release of the parent can
        come between the check and the re-count (a check read from here
        could be stale by the time a ``reattach`` entry arrived). Returns
        the ``gone`` entry that undoes the re-count when the child turns out
        to be gone, or None when nothing was re-counted. Raises
        ``JobNotRetryable`` (the parent went on; nothing written)."""
        k = self.keys
        names = (STATE, PARENT, PARENT_QUEUE, POLICY, PARENT_INC)
        f = pick_fields(names, self.client.hmget(k.job(queue, job_id), *row_fields(names)))
        state, pid, pq, policy, inc = (v.decode() if isinstance(v, bytes) else v for v in f)
        pid, pq = parent_link(job_id, pid, pq)
        if state != "dead" or policy != "id" or not pq or pq == queue:
            return None  # the retry script checks a parent on its own slot itself
        ref = k.job(queue, job_id)
        args = [pq, k.base(pq), pid, ref, inc or "", queue, job_id]
        if not self.scripts.run("reattach_ignored", [k.job(pq, pid)], args):
            return None
        return {"k": "gone", "c": ref, "p": pid, "q": pq, "v": "removed", "i": inc}

    def _follow_up(self, queue: str, report: Report, sent: list[str], budget: int) -> None:
        """Deliver what a remove / cancel sent to other slots (``sent``: the
        entries as pushed onto ``queue``'s outbox) and drive the work left on
        every queue it reached, call by call, until none is left."""
        queues = {queue} if report.more else set()
        if sent:
            report.outcome.merge(self.outbox.deliver_sent(queue, sent))
            queues |= {json.loads(e)["q"] for e in sent}
        if queues:
            self._drive(queues, report, budget, None, "lists")

    @reports_redis_down
    def retry(self, queue, job_id: str | None = None) -> Outcome:
        """Retry-by-id of a dead job (docs/explanation/lifecycle.md): attempts reset, back to
        pending; a parent that children failed retries them (on any queue) and
        returns to awaiting_children; a retried child re-attaches to the parent
        it failed, or that ignored it while that parent has not gone on
        (docs/explanation/lifecycle.md#retrying-a-child-its-parent-ignored).
        ``Outcome.state`` is the job's new state. Raises ``JobNotFound``,
        ``JobNotRetryable`` (with the current state; or naming the parent
        that ignored the job's death and went on without it, on its slot or
        another, nothing written), ``ValueError`` for a bad name or ref.
        The job is ``(queue, job_id)`` or, with ``job_id`` None, a ``JobRef``
        / ``(queue, id)`` / ``"queue/id"`` as ``queue``."""
        if job_id is None:
            queue, job_id = as_ref(queue, self.keys)
        k = self.keys.queue(queue)
        undo = self._reattach_ignored(queue, job_id)
        try:
            reply = self.scripts.run(
                "retry",
                [k.job(job_id), k.dead, k.pending],
                [queue, k.base, job_id, self.clock(), secrets.token_hex(8)],
            )
        except JobNotActive as err:
            # not dead: a retry beside this one took it (and re-attached it once)
            state = err.parts[2] if len(err.parts) > 2 else "not dead"
            raise JobNotRetryable(
                f"job {job_id!r} in queue {queue!r} is {state}; only a dead job can be retried"
            ) from None
        except JobNotFound:
            if undo:  # removed in between: it resolves its parent as removed
                self.outbox.deliver([undo])
            raise
        data = json.loads(reply)
        outcome = self.wire.outcome(reply)
        for ref in data.get("cross") or []:
            cq, cid = self.keys.parse_ref(ref)
            try:
                outcome.merge(self.retry(cq, cid))
            except JobNotRetryable:
                pass  # retried already; its reattach entry is on its way
        # now, not at the next sweep; out of the outbox once delivered
        outcome.merge(self.outbox.deliver_sent(queue, list(data.get("reattach") or [])))
        outcome.state = self.reads.state_of(queue, job_id)
        return outcome
