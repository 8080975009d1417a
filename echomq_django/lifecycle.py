"""Lifecycle: retention, remove and cancel (DESIGN §10.2).

Nothing in Redis grows for ever: finished jobs leave by their queue's
retention (``KEEP_COMPLETED``, ``KEEP_DEAD``) or their own ``keep``, and an
operator can remove or cancel a job with its subtree by id.

Every step is one bounded Lua call (``prune``, ``remove``, ``cancel``; the
rules are in ``lua/lib/lifecycle.lua``): a call does at most ``budget`` units
of work (one per node or child ref touched; ``BUDGET`` = 200 is a few ms of
Redis time) and answers ``more`` when work is left, which the host drives
call after call. So a 10,000-child flow is removed or cancelled without any
one script holding Redis for long. A child on another slot is reached
through the outbox, like fan-in: the scripts return the entries they pushed
and the host delivers them at once (the pump delivers them again later: a
no-op), then drives the work those queues got.

Settings (per queue in ``ECHOMQ["QUEUES"]``), each a count (keep the newest
N) or ``{"COUNT": n, "AGE_S": s}`` (either bound may be left out, not both);
defaults: completed 1,000 and 1 day, dead 10,000 and 14 days.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from .exceptions import JobNotActive, JobNotCancellable, JobNotRemovable
from .jobs import JobState, Outcome

BUDGET = 200  # units of work per script call: a few ms of Redis time at most
MAX_CALLS = 50  # prune calls per queue per timer tick (10,000 removals)
UNBOUNDED = 10**15  # a count or an age (ms) that never binds
KEEP_KEYS = ("KEEP_COMPLETED", "KEEP_DEAD")
KEEP_PARTS = {"COUNT", "AGE_S"}
DEFAULT_KEEP = {
    "KEEP_COMPLETED": {"COUNT": 1000, "AGE_S": 86400},
    "KEEP_DEAD": {"COUNT": 10000, "AGE_S": 14 * 86400},
}


@dataclass(frozen=True)
class Keep:
    """One retention rule: keep at most ``count`` jobs, none older than
    ``age_s`` seconds after it finished; None: no bound on that axis."""

    count: int | None
    age_s: int | None

    def args(self) -> list[int]:
        """The rule as script ARGV: count, age (ms)."""
        return [
            UNBOUNDED if self.count is None else self.count,
            UNBOUNDED if self.age_s is None else self.age_s * 1000,
        ]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def keep_problems(value) -> list[tuple[str, str]]:
    """What is wrong with one ``KEEP_*`` value, as ``(check id, message)``
    pairs (empty: nothing). Settings only; used by the system checks
    (echomq_django.E020-E023) and ``parse_keep``."""
    if _whole(value):
        return []
    if not isinstance(value, dict):
        return [("E020", f"must be a whole number >= 0 (a count) or a dict, got {value!r}")]
    out = []
    unknown = sorted(map(str, set(value) - KEEP_PARTS))
    if unknown:
        out.append(("E021", f"has unknown keys {unknown}"))
    if not set(value) & KEEP_PARTS:
        out.append(("E022", "needs COUNT or AGE_S (or both)"))
    for part in sorted(KEEP_PARTS & set(value)):
        if not _whole(value[part]):
            out.append(("E023", f"{part} must be a whole number >= 0, got {value[part]!r}"))
    return out


KEEP_HINT = (
    "A count keeps the newest N (e.g. 1000); {'COUNT': n, 'AGE_S': s} also drops "
    "what finished more than s seconds ago (either bound may be left out, not both)."
)


def parse_keep(value, what: str = "keep") -> Keep:
    """A ``KEEP_*`` value as a ``Keep``. Raises ``ValueError`` naming the rule."""
    problems = keep_problems(value)
    if problems:
        raise ValueError(f"{what} {'; '.join(m for _, m in problems)}. {KEEP_HINT}")
    if _whole(value):
        return Keep(value, None)
    return Keep(value.get("COUNT"), value.get("AGE_S"))


def retention(mq, queue: str) -> tuple[Keep, Keep]:
    """``(completed, dead)`` rules of ``queue``: its settings, else the defaults."""
    opts = mq.queues.get(queue, {})
    return tuple(parse_keep(opts.get(k, DEFAULT_KEEP[k]), k) for k in KEEP_KEYS)


def job_keep(keep) -> str:
    """A job's own ``keep`` as the row's field text: seconds (int >= 0) it is
    kept after it finishes at most (0: retention's next step takes it), as
    ms; '' for None (its queue's rules). Raises ``ValueError``."""
    if keep is None:
        return ""
    if not _whole(keep):
        raise ValueError(
            f"keep must be a whole number of seconds >= 0 (or None for the queue's "
            f"retention), got {keep!r}"
        )
    return str(keep * 1000)


@dataclass
class Report:
    """What a lifecycle operation did: rows ``removed``, finished jobs
    ``held`` by their flow, script ``calls`` made, the ``state`` a cancel
    found (``active``: marked), and the ``Outcome`` of what else moved."""

    removed: int = 0
    held: int = 0
    calls: int = 0
    more: bool = False
    state: JobState | None = None
    outcome: Outcome = field(default_factory=Outcome, repr=False)

    def add(self, mq, reply) -> list[dict]:
        """Fold one script reply in; returns the entries it sent to other slots."""
        data = json.loads(reply)
        self.removed += data.get("removed") or 0
        self.held += data.get("held") or 0
        self.calls += 1
        self.more = bool(data.get("more"))
        self.outcome.merge(mq._outcome(reply))
        return [json.loads(e) for e in data.get("sent") or []]


def _prune_call(mq, queue: str, budget: int):
    k = mq.keys
    completed, dead = retention(mq, queue)
    return (
        "prune",
        [k.queue_key(queue, "completed"), k.queue_key(queue, "dead")],
        [queue, k.base(queue), mq.clock(), budget, *completed.args(), *dead.args()],
    )


def prune(mq, queue: str, budget: int = BUDGET, max_calls: int | None = MAX_CALLS) -> Report:
    """Run ``queue``'s lifecycle work: queued cancels and removals, jobs
    whose own keep ran out, then the queue's retention; ``budget`` units per
    call, calls until none is left or ``max_calls`` were made (None: no
    limit). Entries for other slots are delivered, and their queues' work
    driven the same way. Returns the ``Report``. DESIGN §10.2."""
    report = Report()
    _drive(mq, {queue}, report, budget, max_calls)
    return report


def _drive(mq, queues: set[str], report: Report, budget: int, max_calls: int | None) -> None:
    from .pump import deliver_entries  # the pump delivers the same entries later

    todo = list(queues)
    while todo:
        queue = todo.pop(0)
        calls = 0
        while max_calls is None or calls < max_calls:
            calls += 1
            sent = report.add(mq, mq.scripts.run(*_prune_call(mq, queue, budget)))
            if sent:
                report.outcome.merge(deliver_entries(mq, sent)[1])
                todo.extend(q for q in {e["q"] for e in sent} if q not in todo)
            if not report.more:
                break


def remove(mq, queue: str, job_id: str, budget: int = BUDGET) -> Report:
    """Remove a job that is not active, with its whole subtree (DESIGN §10.2).

    A removed child resolves its parent like ``remove_dependency`` (the parent
    goes on; a parent on another slot through the outbox). Returns the
    ``Report`` (``removed`` rows). Raises ``JobNotFound``, ``JobNotRemovable``
    (an active job: cancel it, or wait), ``ValueError`` for a bad name."""
    k = mq.keys
    report = Report()
    try:
        reply = mq.scripts.run(
            "remove",
            [k.job(queue, job_id)],
            [queue, k.base(queue), job_id, mq.clock(), budget, secrets.token_hex(8)],
        )
    except JobNotActive:
        raise JobNotRemovable(
            f"job {job_id!r} in queue {queue!r} is active; an active job is not removed "
            "(cancel it, or remove it once it finished)"
        ) from None
    _follow_up(mq, queue, report, report.add(mq, reply), budget)
    return report


def cancel(mq, queue: str, job_id: str, budget: int = BUDGET) -> Report:
    """Cancel a job and its unfinished subtree (DESIGN §10.2): pending,
    delayed and awaiting jobs die now with the error 'cancelled' (their
    parent's policy applies); an active job is marked and dies when its
    worker reports or heartbeats, or its lease expires. ``Report.state`` is
    the state found. Raises ``JobNotFound``, ``JobNotCancellable`` (completed
    or dead), ``ValueError`` for a bad name."""
    k = mq.keys
    report = Report()
    try:
        reply = mq.scripts.run(
            "cancel",
            [k.job(queue, job_id)],
            [queue, k.base(queue), job_id, mq.clock(), budget, secrets.token_hex(8)],
        )
    except JobNotActive as err:
        state = err.parts[2] if len(err.parts) > 2 else "finished"
        raise JobNotCancellable(
            f"job {job_id!r} in queue {queue!r} is {state}; only a pending, delayed, "
            "awaiting or active job can be cancelled"
        ) from None
    sent = report.add(mq, reply)
    report.state = JobState(json.loads(reply)["state"])
    _follow_up(mq, queue, report, sent, budget)
    return report


def _follow_up(mq, queue: str, report: Report, sent: list[dict], budget: int) -> None:
    """Deliver what a remove / cancel sent to other slots and drive the work
    left on every queue it reached, call by call, until none is left."""
    from .pump import deliver_entries

    queues = {queue} if report.more else set()
    if sent:
        report.outcome.merge(deliver_entries(mq, sent)[1])
        queues |= {e["q"] for e in sent}
    if queues:
        _drive(mq, queues, report, budget, None)
