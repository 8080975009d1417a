"""The pump's delivery of one queue's flow outbox (docs/explanation/house.md, "runners/").

``deliver_outbox`` reads the outbox without removing (LRANGE), delivers each
entry on its parent's slot (``mq.outbox.deliver``), then trims exactly the
delivered prefix (``mq.outbox.trim``). A crash between deliver and trim
re-delivers, which the scripts' guards make a no-op. The sweep holds a lock
and the trim checks it, so two pumps on one queue never trim what the other
has not delivered. The lock is a short lease (``lock_ms``, 2 s by default)
renewed after every batch and dropped at the end of the sweep; it holds the
pump's own token for the pump's whole life, so a pump whose drop failed
while Redis was away takes it up again at its next sweep, and a live peer
takes over within ``lock_ms`` of a pump that died mid-sweep. An entry whose
parent is gone is retried on ``max_tries`` sweeps (moved to the back of the
outbox meanwhile, so it never holds up the entries behind it), then moved to
the dead-letter list with its reason.

An entry is the JSON a child's transition pushed onto its queue's outbox
(``{k, c, p, q, pol?, v?}``, lib/flow.lua and lib/lifecycle.lua). Anything
else there (written by hand, by an older version, garbled) is poison: the
pump must dead-letter it with what is wrong with it, never die of it, and
never let it block the entries behind it. ``parse_entry`` says what is
wrong; ``deliver_batch`` delivers a batch and isolates an entry the scripts
refuse.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from contextlib import suppress
from dataclasses import dataclass, field

from ..core.exceptions import RedisUnavailable, SweepLockLost
from ..core.jobs import Outcome, Policy
from ..core.keyspace import validate_id, validate_queue
from ..protocol.client import EchoMQ
from ..protocol.outbox import WORKER_TOKEN
from .dispatcher import kinds_connected

log = logging.getLogger("echomq_django.delivery")

LOCK_MS = 2000  # the sweep lock's lease (ms): how soon a peer takes over from a dead pump
HOLD_S = 0.02  # s a child's delivery waits for its sibling's (OwnDelivery's holds) at most

ENTRY_KINDS = (  # lua/deliver_to_parents.lua
    "done",
    "dead",
    "reattach",
    "gone",
    "rm",
    "cancel",
    "cancelled",
    "rerun",
    "cb",  # a callback job for this slot (docs/howto/retries.md#callbacks-on-another-queue)
)


def parse_entry(raw) -> tuple[dict | None, str | None]:
    """One outbox entry as read: ``(entry, None)`` when it has the shape
    ``deliver_to_parents`` takes (``{k, c, p, q, pol?, v?}``), else ``(None,
    reason)``, the reason naming what is wrong (docs/explanation/reliability.md: a poison
    entry is dead-lettered with it, never crashes the pump)."""
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"malformed entry: not JSON ({err})"
    if not isinstance(entry, dict):
        return None, f"malformed entry: a JSON {type(entry).__name__}, not an object"
    if entry.get("k") not in ENTRY_KINDS:
        return None, f"malformed entry: kind {entry.get('k')!r} is not one of {ENTRY_KINDS}"
    for name in ("c", "p", "q"):
        if not isinstance(entry.get(name), str):
            return None, f"malformed entry: {name!r} is {entry.get(name)!r}, not a string"
    for name in ("pol", "v"):
        if entry.get(name) is not None and not isinstance(entry[name], str):
            return None, f"malformed entry: {name!r} is {entry[name]!r}, not a string"
    if entry["k"] == "cb" and "\n" not in (entry.get("v") or ""):
        return None, "malformed entry: a callback entry's 'v' is '<name>\\n<payload>'"
    if entry.get("pol") and entry["pol"] not in set(Policy):
        return None, f"malformed entry: policy {entry['pol']!r} is not one of {sorted(Policy)}"
    try:
        validate_queue(entry["q"])
        validate_id(entry["p"])
    except ValueError as err:
        return None, f"malformed entry: {err}"
    return entry, None


def deliver_batch(mq: EchoMQ, raw: list, outcome: Outcome, source: str) -> tuple[list, list]:
    """Deliver the outbox entries ``raw`` (as read from ``source``'s outbox,
    a queue name); returns the parsed
    entries (None for a poison one) and a verdict per entry: True
    (delivered), False (its parent is gone: tried again later), None
    (delivered, but no replica of its parent's Cluster master confirmed it
    in time: it stays in the outbox, ``EchoMQ.deliver``) or a reason
    text (poison: dead-letter it now). A batch the scripts refuse (data no
    check foresaw) is delivered again one entry at a time, so only the entry
    at fault is dead-lettered, with Redis' words. Merges what moved into
    ``outcome``; raises ``RedisUnavailable`` (the pump waits it out) for a
    failover or a dropped connection, of the batch or of one entry: such a
    refusal says nothing about the entry, so none is dead-lettered or
    counted as a try for it."""
    parsed = [parse_entry(item) for item in raw]
    entries = [entry for entry, _ in parsed]
    verdicts: list = [reason for _, reason in parsed]
    good = [i for i, entry in enumerate(entries) if entry is not None]
    try:
        flags, moved = mq.outbox.deliver([entries[i] for i in good], source=source)
        outcome.merge(moved)
    except RedisUnavailable:  # "not now", never "no": the entry waits for the next sweep
        raise
    except Exception:
        flags = []
        for i in good:
            try:
                [flag], moved = mq.outbox.deliver([entries[i]], source=source)
                outcome.merge(moved)
            except RedisUnavailable:
                raise
            except Exception as err:
                flag = f"delivery refused: {type(err).__name__}: {err}"
            flags.append(flag)
    for i, flag in zip(good, flags, strict=True):
        verdicts[i] = flag if flag is None or isinstance(flag, str) else bool(flag)
    return entries, verdicts


@dataclass
class SweepReport:
    """What one sweep of one queue did (counts)."""

    delivered: int = 0
    deadlettered: int = 0
    promoted: int = 0
    recovered: int = 0
    released: int = 0
    dead: int = 0
    signals: int = 0  # durable events whose signals this sweep sent
    # parents whose children_timeout_ms passed (docs/howto/priorities-rate-limits.md#flow-control)
    expired: int = 0
    scheduled: int = 0  # periodic jobs fired on this queue (docs/howto/periodic.md)
    pruned: int = 0  # rows retention, removals and cancels took (docs/explanation/lifecycle.md)
    locked: bool = False
    lock_lost: bool = False
    # entries delivered to a Cluster master whose replica did not confirm them
    # in time: kept in the outbox for a later sweep (Scripts.run_many_confirmed)
    unreplicated: int = 0
    outcome: Outcome = field(default_factory=Outcome, repr=False)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "outcome"}


def deliver_outbox(
    mq: EchoMQ,
    queue: str,
    batch: int = 500,
    lock_ms: int = LOCK_MS,
    max_tries: int = 3,
    report: SweepReport | None = None,
    before_trim=None,
    token: str | None = None,
) -> SweepReport:
    """Deliver ``queue``'s outbox, ``batch`` entries per round, until the
    entries it held when the sweep began were each looked at once: an entry
    whose parent is not found moves to the back (``trim_outbox``) and is
    tried again at a later sweep, up to ``max_tries`` deliveries, then
    dead-lettered; it never holds up the entries behind it. Skips (``locked=True``)
    when another pump holds the sweep lock of this queue. ``token``: the
    caller's lock token (a ``Pump`` keeps one for its life; None: a fresh
    one); ``lock_ms`` (ms): the lock's lease, renewed after each batch.
    ``before_trim(queue, actions)`` runs between delivery and trim: the kill
    point tests use it."""
    report = report or SweepReport()
    token = token or secrets.token_hex(8)
    # the lock and the head in one round trip (take_outbox); each entry found
    # when the sweep began is looked at once: one moved to the back waits for
    # a later sweep
    held, left, raw = mq.outbox.take(queue, token, lock_ms, batch)
    if held is None:  # empty: nothing read, no lock taken
        return report
    if not held:
        report.locked = True
        return report
    try:
        asked = batch
        while raw:
            entries, verdicts = deliver_batch(mq, raw, report.outcome, queue)
            if None in verdicts:
                # a failover now would take those deliveries back: the entries
                # from the first of them stay for a later sweep (a second
                # delivery of an entry is a no-op)
                keep = verdicts.index(None)
                report.unreplicated += len(raw) - keep
                log.warning(
                    "outbox of %s: %d deliveries not confirmed on a replica in time; "
                    "kept for the next sweep",
                    queue,
                    len(raw) - keep,
                )
                # the prefix before it is trimmed below; left = keep ends the sweep there
                raw, entries, verdicts, left = raw[:keep], entries[:keep], verdicts[:keep], keep
            actions = _actions(mq, queue, raw, entries, verdicts, max_tries)
            if before_trim is not None:
                before_trim(queue, actions)
            last = len(raw) < asked or left - len(raw) <= 0
            if actions:
                try:  # the last batch's trim drops the lock in its round trip
                    removed = mq.outbox.trim(queue, token, raw, actions, drop=last)
                except SweepLockLost:
                    # our lock expired mid-sweep and another pump may be trimming:
                    # leave the outbox to it; what we delivered is re-delivered as no-ops
                    log.warning(
                        "pump lock on %s expired before the trim; leaving the "
                        "outbox to the pump that holds it",
                        queue,
                    )
                    report.lock_lost = True
                    break
                if removed != len(actions):  # the head moved under us: re-read it
                    log.warning("outbox of %s changed before the trim; re-reading", queue)
                    asked = min(batch, left)
                    held, _, raw = mq.outbox.take(queue, token, lock_ms, asked)
                    if held is None:  # emptied meanwhile: ours still, unless dropped with the trim
                        held = not last
                    if not held:  # dropped with the trim, and taken since: the taker delivers
                        break
                    continue
                held = held and not last
            report.delivered += actions.count("ok")
            report.deadlettered += len(actions) - actions.count("ok") - actions.count("again")
            left -= len(raw)
            if last:
                break
            asked = min(batch, left)
            held, _, raw = mq.outbox.take(queue, token, lock_ms, asked)  # renew, read on
            if held is None:  # emptied meanwhile (nothing read): the lock is ours to drop
                held = True
            if not held:
                log.warning("pump lock on %s expired during the sweep", queue)
                report.lock_lost = True
                break
    finally:
        if held:
            try:
                mq.outbox.lock(queue, token, lock_ms, take=False)
            except RedisUnavailable:  # it expires; and it is ours at our next sweep
                log.warning("pump lock on %s not dropped: Redis is unavailable", queue)
    return report


def _actions(mq: EchoMQ, queue: str, raw: list, entries: list, verdicts: list, max_tries: int):
    """What the trim does with each entry of a delivered batch: ``"ok"``
    (delivered), ``"again"`` (its parent not found yet: to the back, one
    more failed delivery counted) or the reason it is dead-lettered (poison,
    or its parent still not found after ``max_tries`` deliveries)."""
    actions = []
    for item, entry, verdict in zip(raw, entries, verdicts, strict=True):
        if verdict is True:
            actions.append("ok")
            continue
        if isinstance(verdict, str):  # poison: no later try can deliver it
            log.error("outbox of %s: dead-lettering an entry: %s", queue, verdict)
            actions.append(verdict)
            continue
        tries = mq.outbox.count_delivery(queue, item)
        if tries < max_tries:
            actions.append("again")  # to the back: a later sweep tries it again
            continue
        actions.append(
            f"parent {entry.get('q')}/{entry.get('p')} not found after {tries} deliveries"
        )
    return actions


def _held(texts: list[str], mine: list) -> bool:
    """Whether one completion's entries (``mine``: its job and reply) may wait for its
    sibling's: all ``done`` entries, which a second delivery leaves as they are."""
    one = len(mine) == 1 and not isinstance(mine[0][1], Exception)
    return one and bool(texts) and all(json.loads(t).get("k") == "done" for t in texts)


class OwnDelivery:
    """A worker's delivery of what its completions push onto their queues'
    outboxes for parents on other queues (the reporter's; see
    docs/explanation/no-polling.md#a-released-parent-starts-at-once).

    ``mq``: the worker's ``EchoMQ``; ``released(queue)``: a parent on
    ``queue`` was released; ``fetch(queue)`` / ``taken(queue, token,
    claimed)``: the loop's room for a job of a parent's queue, claimed in
    the delivery's round trip, and what that claim gave (the reporter's own,
    None: no such claims). Per batch, on the reporter's thread:
    ``ahead(good, ahead, direct)`` returns the calls to send ahead of the
    completions (or, ``direct=False``, the failures) of ``good``
    (``Finished`` jobs): ``ahead`` (a caller's list, or None) and the take
    of the sweep lock of each queue holding a child whose parent is on
    another queue, under this worker's token for its life;
    ``after(good, replies, ahead)`` puts ``ahead``'s replies back in place,
    then, for each queue whose lock was taken, delivers what its
    completions or deaths pushed (``Outbox.deliver_own``). An error leaves
    the entries to the pumps (logged); nothing raises.

    ``holds(job)``: True when the calling thread runs next a sibling of
    ``job`` (``Direct``): that completion's delivery is held back under the
    lock until the sibling's (one for both) or ``due`` (``HOLD_S`` on;
    ``flush()``), as it cannot release the parent
    (docs/explanation/no-polling.md#a-sibling-rides-in-the-parents-slot)."""

    def __init__(self, mq: EchoMQ, released, fetch=None, taken=None, holds=None) -> None:
        self.mq, self._released, self._fetch, self._taken = mq, released, fetch, taken
        self._holds = holds
        self._back: dict[str, tuple[list[str], list[str]]] = {}  # queue -> (texts, parents)
        self.due: float | None = None  # when what is held back is delivered (monotonic s)
        self.token = WORKER_TOKEN + secrets.token_hex(8)  # pushes wake no pump while it holds it
        self._cross: list[str] = []
        self._subscribed: set[str] = set()  # parents' queues whose events are recorded
        self._calls: list = []
        self._n, self._may_hold = 0, False

    def ahead(self, good: list, ahead: list | None, direct: bool | None = None) -> list | None:
        # on one server the completions resolve their parents themselves: what
        # they still push (behind other entries, or for a parent gone) is the pumps';
        # a death's entries (``direct=False``: fails) always go through the outbox
        self._may_hold = direct is None and self._holds is not None  # completions, not deaths
        direct = self.mq.cross_queue_scripts if direct is None else direct
        cross = {f.job.queue for f in good if f.job.parent_queue not in (None, f.job.queue)}
        self._cross = [] if direct else sorted(cross | self._back.keys())
        self._n = len(ahead or ())
        locks = (self.mq.outbox.lock_call(q, self.token) for q in self._cross)
        self._calls = [*(ahead or ()), *locks]
        return self._calls or None

    def after(self, good: list, replies: list, ahead: list | None) -> None:
        if ahead:
            ahead[:] = self._calls[: self._n]
        for queue, held in zip(self._cross, self._calls[self._n :], strict=True):
            texts, parents = self._back.pop(queue, ([], []))
            if held != 1:  # a pump or another worker holds it: the entries are theirs
                continue
            mine = [(f.job, r) for f, r in zip(good, replies, strict=True) if f.job.queue == queue]
            texts += [t for _, r in mine for t in getattr(r, "sent", ())]
            parents += [j.parent_queue for j, _ in mine if j.parent_queue not in (None, queue)]
            if self._may_hold and mine and self._holds(mine[0][0]) and _held(texts, mine):
                self._back[queue] = (texts, parents)  # with its sibling's, or at HOLD_S
                self.due = self.due or time.monotonic() + HOLD_S
                continue
            self._deliver(queue, texts, parents)
        self.due = self.due if self._back else None
        # a job cancelled as it ran died: its death's entries came back with its refusal
        # (``JobCancelled.sent``); where no lock rode ahead (one server) they are delivered
        # under the lock taken now, if free (docs/explanation/lifecycle.md#cancel)
        late: dict[str, list[str]] = {}
        for f, r in zip(good, replies, strict=True):
            if isinstance(r, Exception) and f.job.queue not in self._cross:
                late.setdefault(f.job.queue, []).extend(getattr(r, "sent", ()))
        for queue, texts in late.items():
            self._deliver_sent(queue, texts)

    def flush(self, claim: bool = True) -> None:
        """Deliver what is held back (at ``due``, or at a stop: ``claim`` False, no
        claim rides); an error leaves the entries to the pumps (logged)."""
        back, self._back, self.due = self._back, {}, None
        for queue, (texts, parents) in back.items():
            try:
                self._deliver(queue, texts, parents, claim)
            except Exception:
                log.exception("delivering the held entries of %s failed", queue)

    def _deliver(self, queue: str, texts: list[str], parents: list[str], claim=True) -> None:
        """Deliver ``texts`` from ``queue``'s outbox (for parents on the queues
        ``parents``), with a claim of the first in the same round trip when the
        loop has room (and ``claim``)."""
        parent_queue = parents[0]
        room = self._fetch(parent_queue) if claim and texts and self._fetch else None
        then = None
        if room is not None:
            count, lease_ms, token = room
            then, now, lease = self.mq.wire.claim_call(parent_queue, count, lease_ms, token)
        more: dict[str, list[str]] = {}
        delivered: list = []  # the delivery's Outcome, once its claim went to the loop

        def hand_over(outcome, got) -> None:
            # the claim's jobs go to the loop as soon as the delivery answered,
            # ahead of the round trip that takes the entries out of the outbox
            if room is not None:
                if not isinstance(got, Exception):
                    try:
                        got = self.mq.wire.claimed(parent_queue, got, now, lease, self.mq)
                    except Exception as err:  # a row that does not decode (ValueError):
                        # the slot held for the claim is freed, as for a claim that raised
                        log.warning("a claim of %s with a delivery failed: %s", parent_queue, err)
                        got = err
                self._taken(parent_queue, token, got)
            delivered.append(outcome)

        try:
            self._subscribe(parents)
            outcome, _ = self.mq.outbox.deliver_own(queue, self.token, texts, then, more, hand_over)
        except Exception as err:
            if not delivered:  # the entries stay in the outbox: a pump delivers them
                if room is not None:
                    self._taken(parent_queue, token, err)  # RedisUnavailable: the loop replays it
                log.warning("delivering the outbox entries of %s failed: %s", queue, err)
                # dropped (if not already), which wakes a pump for them: no push
                # did while this worker held the lock
                with suppress(Exception):
                    self.mq.outbox.lock(queue, self.token, 1, take=False)
                return
            # delivered, not taken out: a pump delivers them again, which changes nothing
            log.warning("taking the delivered outbox entries of %s out failed: %s", queue, err)
            outcome = delivered[0]
        # what those deliveries pushed in turn (a parent a death killed: its own
        # death, for a parent on a third queue), delivered now too, so a chain
        # of deaths does not wait for a pump at its second link; an outbox whose
        # lock another holds is the holder's (a pump is woken by the push; a
        # worker wakes one as it drops the lock with entries left)
        for target, pushed in more.items():
            self._deliver_sent(target, pushed, outcome)
        for released, _ in outcome.released:
            self._released(released)

    def _deliver_sent(self, queue: str, texts: list[str], outcome=None) -> None:
        """``Outbox.deliver_sent`` of ``texts`` from ``queue``'s outbox, the
        lock not waited for (a pump holding it was woken by the push, a worker
        holding it wakes one as it drops it); what it
        released goes into ``outcome``, or, with None, is woken here. An
        error leaves the entries to the pumps (logged)."""
        if not texts:
            return
        try:
            self._subscribe([json.loads(t).get("q") for t in texts])
            got = self.mq.outbox.deliver_sent(queue, texts, wait_s=0)
        except Exception as err:
            log.warning("delivering the outbox entries of %s failed: %s", queue, err)
            return
        if outcome is not None:
            outcome.merge(got)
            return
        for released, _ in got.released:
            self._released(released)

    def _subscribe(self, queues: list) -> None:
        """Record the signal event kinds this process receives for each of
        ``queues`` (None skipped) not recorded yet, before a delivery writes
        there, as a pump does for its queues (docs/explanation/signals.md#what-it-costs)."""
        if new := {q for q in queues if q is not None} - self._subscribed:
            self.mq.signal_events.subscribe(sorted(new), kinds_connected())
            self._subscribed |= new
