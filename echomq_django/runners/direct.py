"""The direct path: a handler thread that finished the worker's only claimed
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

FREED = object()  # on the loop's inbox: a slot the direct path gave back


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
