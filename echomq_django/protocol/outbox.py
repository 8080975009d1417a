"""The flow outbox (docs/explanation/house.md, "protocol/"): a queue's list of fan-in
entries for parents on other slots, and what the pump and ``EchoMQ`` do
with it: take the sweep lock and read the head in one step
(``lua/take_outbox.lua``; ``lua/lock_outbox.lua`` takes or drops the lock alone),
deliver entries on their parents' slots (``lua/deliver_to_parents.lua``),
trim what was delivered (``lua/trim_outbox.lua``) or forget what a caller
delivered itself (``lua/forget_outbox.lua``), count failed deliveries and
read the dead-letter list.

``Outbox`` is the part ``mq.outbox``; the pump's delivery
(``runners/delivery.py``) and ``Lifecycle`` (retry, remove, cancel) call it.
This is the Redis outbox of flows, not the commit outbox of
``commit_outbox.py``.
"""

from __future__ import annotations

import json
import secrets
import time

from ..core.jobs import Outcome, Policy, to_text
from ..core.keyspace import validate_id, validate_queue
from .errors import TRANSIENT, connection_error, reports_redis_down
from .scripts import socket_timeout
from .wire import Part

OUTBOX_DEADLETTER_MAX = 1_000  # dead-lettered outbox entries kept per queue, newest
SENT_LOCK_MS = 5_000  # deliver_sent: the sweep lock's lease while a caller delivers its own entries
SENT_WAIT_S = 3.0  # deliver_sent: how long it waits out a pump's sweep (a pump's lease is 2 s)
SENT_BLOCK_MIN_S = 0.01  # deliver_sent: shortest BLPOP (s); Redis reads a timeout of 0 as for ever
SENT_SOCKET_MARGIN_S = 1.0  # deliver_sent: a BLPOP ends this much before the socket timeout (s)
OWN_LOCK_MS = 2_000  # deliver_own: a worker's take of the outbox lock (ms; a pump's default)
WORKER_TOKEN = "w"  # a worker's sweep-lock token starts with it (lua/lock_outbox.lua)


class Outbox(Part):
    """The flow-outbox part of ``EchoMQ`` (``mq.outbox``)."""

    def deliver(
        self,
        entries: list[dict],
        sent: dict[str, list[str]] | None = None,
        source: str | None = None,
    ) -> tuple[list[bool | None], Outcome]:
        """Deliver outbox entries (dicts ``{k, c, p, q, pol?, v?, i?}``; ``i``
        the parent's incarnation, docs/explanation/protocol.md#incarnations) to their
        parents, one ``deliver_to_parents`` per parent queue, pipelined. Returns a
        delivered flag per entry (False: parent row gone, or the entry is
        malformed; None: delivered, but on a Cluster master whose replica did
        not confirm it in time, so the entry must stay in ``source``'s outbox
        for a later sweep: ``Scripts.run_many_confirmed``) and the merged
        ``Outcome``. ``source`` (str): the queue whose outbox holds the
        entries (None: no replica is waited for). ``sent``, when given, gets
        ``{queue: [entry texts]}`` of what the deliveries pushed onto those
        queues' outboxes for a caller to deliver at once (the deaths a
        delivered ``cancel`` caused). Raises what a script raises."""
        flags, outcome, _ = self._deliver(entries, sent, source, None)
        return flags, outcome

    def _deliver(self, entries, sent, source, then) -> tuple[list, Outcome, object]:
        """``deliver``, and ``then`` (a script call, or None) after the
        deliveries in the same round trip; returns its reply (or exception)
        third."""
        groups: dict[str, list[int]] = {}
        flags = [False] * len(entries)
        for i, e in enumerate(entries):
            try:
                validate_queue(e["q"])
                validate_id(e["p"])
            except (KeyError, TypeError, ValueError):
                continue
            groups.setdefault(e["q"], []).append(i)
        calls = []
        for queue, idx in groups.items():
            k = self.keys.queue(queue)
            args: list = [queue, k.base, self.clock()]
            for i in idx:
                e = entries[i]
                args += [
                    e["k"],
                    e["c"],
                    e["p"],
                    e.get("pol") or Policy.FAIL_PARENT,
                    e.get("v") or "",
                    e.get("i") or "",
                ]
            calls.append(("deliver_to_parents", [k.pending, k.awaiting], args))
        outcome = Outcome()
        after = None if source is None else self.keys.queue(source).outbox
        replies, confirmed = self.scripts.run_many_confirmed(
            calls if then is None else [*calls, then], after
        )
        extra = replies.pop() if then is not None else None
        for (_queue, idx), reply, safe in zip(groups.items(), replies, confirmed, strict=False):
            if isinstance(reply, Exception):
                raise reply
            outcome.merge(self.wire.outcome(reply))
            data = json.loads(reply)
            for i, ok in zip(idx, data["delivered"], strict=False):
                flags[i] = bool(ok) if safe else None
            if sent is not None and data.get("sent"):
                sent.setdefault(_queue, []).extend(data["sent"])
        return flags, outcome, extra

    def deliver_sent(self, queue: str, texts: list[str], wait_s: float = SENT_WAIT_S) -> Outcome:
        """Deliver now the outbox entries a script on ``queue`` just pushed
        (``texts``: the entries exactly as pushed, the script's ``sent``)
        and take the delivered ones out of the outbox (then the same for
        what those deliveries pushed in turn: a cancelled child's death for
        its parent), so the pump does not
        deliver them again: a second delivery is not a no-op when the flow
        was added again under the same ids, or a cancelled parent retried, in
        between. Done under the outbox's sweep lock (no pump is between its
        read and its trim): while a pump holds it, this waits for the pump's
        sweep to end (``SENT_WAIT_S`` s at most, then the entries are left to
        the pump's next sweep). An entry whose parent is gone stays for the
        pump to dead-letter, one no replica confirmed (``deliver``) for the
        pump to deliver again. ``wait_s``: how long a pump's sweep is waited
        out (0: the entries are left to the holder at once, as a worker's
        reporter does). Returns the ``Outcome``. Raises what a script
        raises, ``RedisUnavailable`` for a wait Redis did not answer.
        docs/explanation/protocol.md#the-flow-outbox-and-the-pump; the wait blocks, it does not
        poll: see ``_wait_for_sweep_lock``."""
        if not texts:
            return Outcome()
        k, token = self.keys.queue(queue), secrets.token_hex(8)
        give_up = time.monotonic() + wait_s
        while not self.lock(queue, token, SENT_LOCK_MS):
            left = give_up - time.monotonic()
            if left <= 0:
                return Outcome()
            self._wait_for_sweep_lock(k, left)
        more: dict[str, list[str]] = {}
        try:
            flags, outcome = self.deliver([json.loads(t) for t in texts], more, queue)
            done = [t for t, ok in zip(texts, flags, strict=True) if ok]  # None: the pump's
            if done:
                self.scripts.run(*self._forget_call(k, token, done))
        finally:
            self.lock(queue, token, SENT_LOCK_MS, take=False)
        for target, pushed in more.items():  # what those deliveries sent on, one level down
            outcome.merge(self.deliver_sent(target, pushed, wait_s))
        return outcome

    def lock_call(
        self, queue: str, token: str, lease_ms: int = OWN_LOCK_MS, take: bool = True
    ) -> tuple:
        """The take (``take=False``: the drop) of ``queue``'s sweep lock under
        ``token`` for ``lease_ms`` (ms), as a script call ``(name, keys,
        args)`` for a caller's pipeline (a worker's completions,
        ``deliver_own``); the take's reply is 1 when the caller holds the
        lock, 0 when another token does (see ``lock``). A worker's ``token``
        starts with ``w`` (``WORKER_TOKEN``): while it holds the lock, pushes
        onto the outbox do not wake the pump, and its drop does when entries
        are left (docs/explanation/protocol.md#the-flow-outbox-and-the-pump)."""
        k = self.keys.queue(queue)
        args = [token, int(lease_ms), "1" if take else "0"]
        return ("lock_outbox", [k.pump_lock, k.pump_unlocked, k.outbox, k.outbox_wake], args)

    @staticmethod
    def _forget_call(k, token: str, texts: list[str]) -> tuple:
        """``forget_outbox`` of ``texts`` under ``token``, for the queue whose
        ``QueueKeys`` are ``k``, as a script call."""
        return ("forget_outbox", [k.outbox, k.pump_lock], [token, *texts])

    def deliver_own(
        self,
        queue: str,
        token: str,
        texts: list[str],
        then: tuple | None = None,
        more: dict[str, list[str]] | None = None,
        delivered=None,
    ) -> tuple[Outcome, object]:
        """Deliver the entries ``texts`` (exactly as pushed) that the caller's
        own scripts pushed onto ``queue``'s outbox after it took the outbox's
        sweep lock under ``token`` (``lock_call``, in the same round trip and
        before them): no pump has read them, none can until the lock is
        dropped. Then, in one more round trip, take the delivered ones out of
        the outbox (``forget_outbox``) and drop the lock, so no pump delivers
        them again; an entry whose parent is gone, or that no replica
        confirmed, stays for the pump. ``then``: a script call run after the
        deliveries in their round trip (a claim of a parent's queue), whose
        reply (or exception) is returned beside the ``Outcome``. ``more``,
        when given, gets what the deliveries pushed in turn, as ``deliver``'s
        ``sent`` (a parent a `dead` entry killed: its own death, for a parent
        of its own on another slot). ``delivered``: None, or a callable
        taking ``(outcome, reply of then)``, called once the deliveries'
        round trip answered and before the one that takes them out: a parent
        the claim took starts one round trip sooner; the entries are not
        out of the outbox yet, so a crash or a failed second round trip
        leaves them to a pump, whose delivery of them again changes nothing.
        Raises what ``deliver`` raises (the lock is then dropped if Redis
        answers; else it expires after its lease, and the pump delivers the
        entries), and ``RedisUnavailable`` from the second round trip (after
        ``delivered`` was called; the lock then runs out its lease, and the
        pump delivers the entries again).
        docs/explanation/no-polling.md#a-released-parent-starts-at-once."""
        k = self.keys.queue(queue)
        drop = self.lock_call(queue, token, 1, take=False)
        try:
            entries = [json.loads(t) for t in texts]
            flags, outcome, extra = self._deliver(entries, more, queue, then)
            if delivered is not None:
                delivered(outcome, extra)
        except BaseException:
            self.scripts.run_many([drop])
            raise
        done = [t for t, ok in zip(texts, flags, strict=True) if ok]
        self.scripts.run_many([self._forget_call(k, token, done), drop] if done else [drop])
        return outcome, extra

    def _wait_for_sweep_lock(self, k, left: float) -> None:
        """Block until the sweep lock of the queue whose ``QueueKeys`` are
        ``k`` may be free, after a refused take: a BLPOP on
        ``k.pump_unlocked``, where each drop of the lock leaves a mark
        (lua/lock_outbox.lua), for ``left`` s at most and never past the
        holder's lease (its PTTL, ms): a holder that died drops nothing, and
        its lock is taken at its expiry, not after ``SENT_WAIT_S``. Returns
        at once when the lock is gone already (dropped or expired since the
        take). A mark left by an earlier drop only costs one more take; a
        drop between the PTTL and the BLPOP leaves its mark for this BLPOP.
        Each BLPOP ends ``SENT_SOCKET_MARGIN_S`` s before the client's socket
        timeout (half of a shorter one), which would cut it and make redis-py
        send it again. Raises ``RedisUnavailable``.
        docs/explanation/protocol.md#the-flow-outbox-and-the-pump."""
        try:
            lease_ms = self.client.pttl(k.pump_lock)  # -2: gone; -1: no expiry (not ours)
            if lease_ms == -2:
                return
            wait = left if lease_ms < 0 else min(left, lease_ms / 1000)
            cut = socket_timeout(self.client)
            if cut:
                wait = min(
                    wait, cut - SENT_SOCKET_MARGIN_S if cut > 2 * SENT_SOCKET_MARGIN_S else cut / 2
                )
            self.client.blpop([k.pump_unlocked], timeout=max(wait, SENT_BLOCK_MIN_S))
        except TRANSIENT as err:
            raise connection_error(self.client, err) from err

    def trim(
        self, queue: str, token: str, read: list, actions: list[str], drop: bool = False
    ) -> int:
        """Remove the outbox head the pump read (``read``: the raw entries, in
        order) once delivered: ``actions[i]`` is ``"ok"``, ``"again"`` (its
        parent was not found: to the back of the outbox, for a later sweep)
        or the reason that entry goes to the dead-letter list, which keeps its newest
        ``OUTBOX_DEADLETTER_MAX`` entries (trimmed in the same script).
        ``token`` is the sweep lock's; ``drop`` (bool): drop that lock right
        after the trim, in the same round trip (a sweep's last batch), whatever
        the trim answered. Returns how many entries were removed (0 when the
        head moved). Raises ``SweepLockLost`` when the lock is no longer
        ``token``'s, ``RedisUnavailable`` when Redis did not answer.
        docs/explanation/protocol.md#the-flow-outbox-and-the-pump."""
        k = self.keys.queue(queue)
        pairs = (v for pair in zip(read, actions, strict=False) for v in pair)
        call = (
            "trim_outbox",
            [k.outbox, k.pump_lock, k.deadletter, k.outbox_tries],
            [token, self.clock(), OUTBOX_DEADLETTER_MAX, *pairs],
        )
        if not drop:
            return self.scripts.run(*call)
        drop = self.lock_call(queue, token, 1, take=False)  # a drop's lease is not read
        removed, _ = self.scripts.run_many([call, drop])
        if isinstance(removed, Exception):
            raise removed
        return removed

    def take(
        self, queue: str, token: str, lease_ms: int, count: int
    ) -> tuple[bool | None, int, list]:
        """Take (or renew) the sweep lock of ``queue``'s outbox for
        ``lease_ms`` (ms) under ``token`` and read the outbox's first ``count``
        (>= 1) entries in the same round trip (``lua/take_outbox.lua``).
        Returns ``(held, length, entries)``: ``held`` False when another
        token holds the lock, None when the outbox is empty (the lock then
        neither taken nor touched), both with ``(0, [])``; True with the
        outbox's length and its ``entries``, raw (bytes or str, as the
        client decodes), not removed. Raises ``RedisUnavailable`` when Redis
        did not answer. docs/explanation/protocol.md#the-flow-outbox-and-the-pump."""
        k = self.keys.queue(queue)
        reply = self.scripts.run(
            "take_outbox", [k.pump_lock, k.outbox], [token, int(lease_ms), int(count)]
        )
        if reply[0] != 1:
            return (None if reply[0] == 2 else False), 0, []
        return True, int(reply[1]), list(reply[2:])

    def lock(self, queue: str, token: str, lease_ms: int, take: bool = True) -> bool:
        """Take (or renew) the sweep lock of ``queue``'s outbox for ``lease_ms``
        (ms) under ``token``, or with ``take=False`` drop it if it is
        ``token``'s. Returns whether the caller holds it (take) or held it
        (drop). The lock always expires; a lock already holding ``token`` is
        the caller's own (left by a drop that failed while Redis was away),
        renewed, not waited out
        (docs/explanation/reliability.md#a-pumps-lock-never-outlives-a-pump-for-long). A drop leaves
        a mark on ``pump_unlocked`` for a caller waiting for the lock (``deliver_sent``).
        docs/explanation/protocol.md#the-flow-outbox-and-the-pump."""
        return bool(self.scripts.run(*self.lock_call(queue, token, lease_ms, take)))

    def count_delivery(self, queue: str, entry: bytes | str) -> int:
        """Count one more failed delivery of an outbox ``entry`` (raw text);
        returns the count so far."""
        return self.client.hincrby(self.keys.queue(queue).outbox_tries, entry, 1)

    def length(self, queue: str) -> int:
        """How many entries ``queue``'s outbox holds."""
        return self.client.llen(self.keys.queue(queue).outbox)

    def head(self, queue: str, count: int) -> list:
        """The first ``count`` entries of ``queue``'s outbox, raw (bytes or
        str, as the client decodes), not removed: the pump delivers them, then
        ``trim_outbox`` removes what was delivered."""
        return self.client.lrange(self.keys.queue(queue).outbox, 0, count - 1)

    @reports_redis_down
    def deadletters(self, queue: str, start: int = 0, end: int = -1) -> list[dict]:
        """Dead-lettered outbox entries: ``[{entry: {...}, reason, at (ms)}]``;
        an entry that is not JSON (a poison one) comes back as its raw text,
        with the reason the pump gave."""
        raw = self.client.lrange(self.keys.queue(queue).deadletter, start, end)
        out = []
        for item in raw:
            try:
                d = json.loads(item)
                if "reason" not in d or "entry" not in d:  # the keys the pump writes
                    raise KeyError("reason")
            except (ValueError, KeyError, TypeError):  # written by hand, or garbled
                d = {"entry": to_text(item), "reason": "unreadable dead-letter entry", "at": None}
            else:
                try:  # a poison entry stays its raw text beside the real reason
                    d["entry"] = json.loads(d["entry"])
                except (ValueError, TypeError):
                    pass
            out.append(d)
        return out
