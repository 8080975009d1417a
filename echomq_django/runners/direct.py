"""Claims that ride a completion, and the direct path that starts their jobs
on the thread that reported.

A claim riding the round trip that completes a child
(docs/explanation/no-polling.md#a-released-parent-starts-at-once) takes, on one
server, the parent that completion released, or on a Redis Cluster the child's
next sibling; either starts without a claim of its own. ``ride_queues``,
``sibling_queues``, ``hold_ride``, ``ride_room`` and ``sibling_or_else`` say
where one rides and which slot it takes. ``fetch`` is the loop's
``ClaimLoop.fetch(queue, yields_to=None, last=False)``: ``(count, lease ms,
token)`` for a slot held for the claim, or None. ``across`` is
``EchoMQ.cross_queue_scripts``: one server, where ``complete`` resolves a
parent on another queue itself. ``finished`` and ``good`` are lists of
``reporter.Finished``.

The direct path: a handler thread that finished the worker's only claimed
job while the reporter has nothing to do completes it itself, and runs the job
its completion claimed, on the same thread
(docs/explanation/no-polling.md#the-direct-path).

On the batched path a finished job crosses four thread hand-offs before the
job its completion releases starts: handler -> loop -> reporter -> loop ->
handler, each a wake-up and a wait for the interpreter lock. When the
reporter is idle nothing would be batched with it, so the handler thread
takes the reporter's turn (``Reporter.report_own``: the same ``report``,
the same round trip, the same claim riding the completion) and keeps the
slot for the claimed job. Only when no other job of the worker is claimed
and unreported: under load (other jobs running, or finished on their way)
every job takes the batched path as before, and a drain keeps its batches.

Counts stay the loop's (``ClaimLoop``): the finished job's slot passes to
the job claimed (``executing`` unchanged), or, when none came, goes back
with ``FREED`` on the loop's inbox. A riding claim that raised, or gave
nothing, takes the loop's own path (``ClaimLoop._taken``), so a lost reply
is replayed as on the batched path; a report that raised hands the job to
the reporter thread, which waits the outage out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

FREED = object()  # on the loop's inbox: a slot the direct path gave back

Fetch = Callable[..., tuple | None]


def completing(finished: list) -> list:
    """Those of ``finished`` that completed: not failed, postponed or held."""
    return [
        f for f in finished if f.error is None and f.postpone_ms is None and not f.wait_children
    ]


def ride_queues(finished: list, across: bool) -> list[str]:
    """Where a claim may ride the completion of ``finished`` (those that completed,
    not postponed or held), in order: a parent's queue, a child's own first, another
    only if ``complete`` resolves it (``across``)."""
    good = completing(finished)
    mine = [f.job.queue for f in good if f.job.parent_queue == f.job.queue]
    other = [f.job.parent_queue for f in good if across and f.job.parent_queue]
    return list(dict.fromkeys(mine + other))


def sibling_queues(finished: list, across: bool) -> list[str]:
    """On a Redis Cluster (``across`` false), the queues of the children among
    ``finished`` that completed and whose parent is on another queue: a claim of
    such a queue rides their completion into the worker's last free slot, so a
    sibling starts without a claim of its own, and the parent's claim rides the
    delivery (docs/explanation/no-polling.md#a-sibling-rides-in-the-parents-slot).
    On one server (``across``) none: there it rides after the parent's claim
    (``sibling_or_else``)."""
    if across:
        return []
    good = completing(finished)
    return list(
        dict.fromkeys(f.job.queue for f in good if f.job.parent_queue not in (None, f.job.queue))
    )


def _rides(finished: list, across: bool) -> list[tuple[str, bool]]:
    """``(queue, last)`` where a claim may ride, in order: ``ride_queues``, then
    ``sibling_queues`` (``last``: only into the last free slot)."""
    return [(q, False) for q in ride_queues(finished, across)] + [
        (q, True) for q in sibling_queues(finished, across)
    ]


def hold_ride(
    fetch: Fetch, finished: list, across: bool, rides: list | None = None
) -> tuple[str, tuple] | None:
    """``(queue, room)``: a slot held (``fetch``) at the hand-over of ``finished``
    for the claim riding their completion, or None: the parent's queue's, else a
    sibling's (the last free slot only); a claim of the loop's own would race it
    for the parent released, and come back empty. ``rides``: ``_rides``' answer,
    when the caller has it already."""
    for queue, last in _rides(finished, across) if rides is None else rides:
        if (room := fetch(queue, last=last) if last else fetch(queue)) is not None:
            return queue, room
    return None


def ride_room(
    fetch: Fetch | None, held: list[tuple[str, tuple]], good: list, across: bool
) -> tuple[str | None, tuple | None]:
    """The queue whose claim rides the completion of ``good`` and the loop's room
    there, or ``(None, None)``: a slot the loop held at the hand-over (taken out
    of ``held``, ``[(queue, room)]``), else one ``fetch`` gives, as ``hold_ride``
    chooses (docs/explanation/protocol.md#cross-queue-scripts-on-one-server)."""
    if fetch is None:
        return None, None
    rides = _rides(good, across)
    queues = {queue for queue, _ in rides}
    for i, (queue, got) in enumerate(held):
        if queue in queues:
            del held[i]
            return queue, got
    return hold_ride(fetch, good, across, rides) or (None, None)


def sibling_or_else(fetch: Fetch, good: list, queue: str, token: str, across: bool) -> tuple | None:
    """``(queue2, 1, lease ms, token2)``: on one server, a claim of a finished
    child's own queue riding after the claim ``token`` of ``queue`` (its parent's),
    in the slot held for that one, each yielding to the other, so one of them takes
    a job: a sibling still pending starts without a claim of its own
    (docs/explanation/no-polling.md#a-sibling-rides-in-the-parents-slot)."""
    if not across:
        return None
    for q in dict.fromkeys(f.job.queue for f in good if f.job.parent_queue == queue):
        if q != queue and (got := fetch(q, yields_to=(queue, token))) is not None:
            return (q, *got)
    return None


class Direct:
    """A ``ClaimLoop``'s direct path (see the module). ``finish(finished,
    done)``: from a handler thread, a ``reporter.Finished`` reported here,
    or posted to ``done`` (the run's ``wake.Inbox``); returns the job to run
    next on that thread, or None. ``spare()``: slots the calling thread's
    report frees (the loop's ``fetch`` counts them free); ``took(queue,
    token, claimed)``: True when the calling thread keeps that claim's job
    (the loop's ``_taken`` then does nothing)."""

    def __init__(self, loop) -> None:
        self.loop = loop
        self._here = threading.local()  # spare: 1 while reporting; got: claims kept
        self.used = 0  # jobs reported on the direct path (every run)

    def spare(self) -> int:
        return getattr(self._here, "spare", 0)

    def holds_sibling(self, job) -> bool:
        """(A handler thread reporting) True when the claim riding its report gave
        this thread a sibling of ``job`` (the same parent) to run next."""
        got = getattr(self._here, "got", None)
        return (
            bool(got)
            and job.parent is not None
            and any(
                j.parent == job.parent and j.parent_queue == job.parent_queue for j in got[0][2]
            )
        )

    def took(self, queue: str, token: str, claimed) -> bool:
        got = getattr(self._here, "got", None)
        if got is None or got or isinstance(claimed, BaseException) or len(claimed) != 1:
            return False  # not this thread's, one kept already, raised or empty: the loop's
        got.append((queue, token, claimed))
        return True

    def finish(self, finished, done):
        """Report ``finished`` here when it completed, no other job is claimed
        and unreported, and the reporter is idle (else post it to ``done``);
        returns the job its completion claimed, to run on this thread, or None."""
        loop, job = self.loop, finished.job
        if finished.error is not None or finished.postpone_ms is not None:
            done.put(finished)
            return None
        # another job claimed and not reported (running, or finished on its way):
        # a batch may form, and a busy drain keeps its batches
        if finished.wait_children or done is not loop.done or len(loop.claims) > 1:
            done.put(finished)
            return None
        here = self._here
        here.spare, here.got = 1, []
        try:
            reported = loop.reporter.report_own(finished)
        finally:
            got, here.spare, here.got = here.got, 0, None
        if not reported:  # busy, behind, closing or Redis refused: the batched path
            for claim in got:  # its claim was taken: the loop runs it
                loop._taken(*claim)
            done.put(finished)
            return None
        self.used += 1
        loop.idle.timers.finished(job.queue)  # written: its queue's next sweep prunes
        nxt = self._keep(got)
        if nxt is None or loop.concurrency > 1:
            done.put(FREED if nxt is None else None)  # a slot, or a parent released
        return nxt

    def _keep(self, got):
        """The job a riding claim gave this thread (``took``: one at most), its
        slot the finished job's; None when none came (or it is an earlier
        run's, left to its lease)."""
        loop = self.loop
        if not got:
            return None
        _, token, claimed = got[0]
        with loop._fetch_lock:
            if token not in loop._tokens:
                return None
            loop.fetching -= loop._tokens.pop(token)
            loop._pairs.pop(token, None)
            loop.claimed += 1
        loop.claims.add(claimed)
        claimed[0]._writes = loop.writes
        return claimed[0]
