"""The flow half of ``EchoMQ``'s script calls (DESIGN §5, §6): landing a flow
(``enqueue_flow``), delivering cross-queue outbox entries to their parents
(``deliver_to_parents``) and trimming the delivered prefix of an outbox
(``trim_outbox``), plus the outbox bookkeeping the pump asks for.

``FlowCalls`` is mixed into ``EchoMQ`` (client.py), as ``Reads`` is: these
are ``EchoMQ`` methods, kept in their own module for size. The pump and
``EchoMQ.retry`` deliver entries through ``deliver``; nothing else builds
these scripts' keys or arguments.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time

from ..core import flows as _flows
from ..core.flows import Flow, FlowRef
from ..core.jobs import Outcome, Policy, to_json, to_text
from ..core.keyspace import validate_id, validate_queue
from .errors import TRANSIENT, connection_error
from .scripts import socket_timeout

FLOW_CHUNK = 5000  # nodes per enqueue_flow script: keeps one script well under ~50 ms
OUTBOX_DEADLETTER_MAX = 1_000  # dead-lettered outbox entries kept per queue, newest
SENT_LOCK_MS = 5_000  # deliver_sent: the sweep lock's lease while a caller delivers its own entries
SENT_WAIT_S = 3.0  # deliver_sent: how long it waits out a pump's sweep (a pump's lease is 2 s)
SENT_BLOCK_MIN_S = 0.01  # deliver_sent: shortest BLPOP (s); Redis reads a timeout of 0 as for ever
SENT_SOCKET_MARGIN_S = 1.0  # deliver_sent: a BLPOP ends this much before the socket timeout (s)


def opt(value) -> str:
    """An optional integer as script text: '' means "the queue's setting"."""
    return "" if value is None else str(int(value))


class FlowCalls:
    """Flow methods of ``EchoMQ``; expects ``self.client``, ``self.keys``,
    ``self.scripts``, ``self.clock``, ``self.encode``, ``self.flow_chunk``,
    ``self.fault_hook``, ``self.note_queues`` and ``self._outcome``."""

    def _step_call(self, queue: str, nodes: list, mode: str):
        """One ``enqueue_flow`` call for a step, in the script's flat group
        format (see its header): nodes that share name, parent, policy and
        settings share one group header."""
        k = self.keys
        qk = k.queue(queue)
        flat: list[str] = []
        for (name, pid, pq, policy, ma, bo, gate, opts, inc, pinc), group in itertools.groupby(
            nodes,
            key=lambda n: (
                n.name,
                n.parent_id,
                n.parent_queue,
                n.policy,
                n.max_attempts,
                n.backoff_ms,
                n.gate,
                n.opts,
                n.inc,
                n.parent_inc,
            ),
        ):
            group = list(group)
            flat += [
                name,
                pid,
                pq,
                policy,
                opt(ma),
                opt(bo),
                "1" if gate else "0",
                str(len(group)),
                opts,
                inc,
                pinc,
            ]
            for n in group:
                if n.children:
                    refs = k.refs(n.children)
                    flat += [n.id, n.payload, str(len(refs)), *refs]
                else:
                    flat += [n.id, n.payload, "0"]
        # one JSON argument: 9+ ARGV per node cost more in redis-py than in Redis
        return (
            "enqueue_flow",
            [qk.pending, qk.awaiting],
            [queue, qk.base, self.clock(), mode, to_json(flat)],
        )

    def add_flow(self, flow: Flow) -> FlowRef:
        """Land a flow (a tree of ``Flow`` nodes); returns its ``FlowRef``.

        One queue: one atomic script. Several queues: parent first, one script
        per (depth, queue) step, stopping at the first error with every parent
        already landed held (DESIGN §6); adding the same flow again completes
        it, skipping rows already there. Raises ``FlowError`` (duplicate ids,
        cycle), ``ValueError`` (names), ``PayloadError``, ``FlowConflict`` (an
        id taken by another job or flow: nothing written when found before
        the first write), ``RedisUnavailable``.
        """
        return self.add_flows([flow])[0]

    def add_flows(self, flows: list[Flow]) -> list[FlowRef]:
        """Land several flows. Every flow on a single queue goes in one
        pipelined round trip (its chunks in order: one slot, one connection);
        a cross-queue flow lands step by step, parent first. Same errors as
        ``add_flow``; when a flow takes more than one script, every user-given
        id is gated by a read-only pass before the first write."""
        plans = [_flows.plan(f, self.encode) for f in flows]
        seen: set = set()
        for nodes in plans:
            for n in nodes:
                if n.gate:
                    if (n.queue, n.id) in seen:
                        raise _flows.FlowError(
                            f"job id {n.id!r} in queue {n.queue!r} is in two flows"
                        )
                    seen.add((n.queue, n.id))
        self.note_queues(dict.fromkeys(n.queue for nodes in plans for n in nodes))
        all_steps = [_flows.steps(nodes, self.flow_chunk) for nodes in plans]
        gated = [any(n.gate for n in nodes) for nodes in plans]
        checks = [
            self._step_call(q, ns, "check")
            for s, g in zip(all_steps, gated, strict=False)
            if len(s) > 1 and g
            for q, ns in s
        ]
        for reply in self.scripts.run_many(checks):
            if isinstance(reply, Exception):
                raise reply
        # single-queue flows: every chunk of every such flow in one pipeline
        one_queue = [i for i, nodes in enumerate(plans) if len({n.queue for n in nodes}) == 1]
        calls = [(i, self._step_call(q, ns, "write")) for i in one_queue for q, ns in all_steps[i]]
        counts: dict[int, list] = {i: [] for i in range(len(plans))}
        for (i, _), reply in zip(calls, self.scripts.run_many([c for _, c in calls]), strict=False):
            if isinstance(reply, Exception):
                raise reply
            counts[i].append(reply)
        for i, step_list in enumerate(all_steps):
            if i in one_queue:
                continue
            # a parent met again keeps its incarnation: its children on
            # other queues (later steps) must carry that one, not this add's
            kept: dict[tuple[str, str], str] = {}
            for n, (queue, ns) in enumerate(step_list):
                if kept:
                    for node in ns:
                        got = kept.get((node.parent_queue, node.parent_id))
                        if got is not None and node.parent_queue != queue:
                            node.parent_inc = got
                reply = self.scripts.run(*self._step_call(queue, ns, "write"))
                met = reply[3]
                for j in range(0, len(met), 2):
                    kept[(queue, to_text(met[j]))] = to_text(met[j + 1])
                counts[i].append(reply)
                if self.fault_hook:
                    self.fault_hook(n, queue, ns)
        refs = []
        for i, nodes in enumerate(plans):
            root = nodes[0]
            refs.append(
                FlowRef(
                    queue=root.queue,
                    parent_id=root.id,
                    child_ids=[cid for _, cid in root.children],
                    nodes=[(n.queue, n.id) for n in nodes],
                    landed=sum(int(c[0]) for c in counts[i]),
                    skipped=sum(int(c[1]) for c in counts[i]),
                    deduplicated={
                        (q, to_text(c[j])): to_text(c[j + 1])
                        for c, (q, _) in zip(counts[i], all_steps[i], strict=True)
                        for j in range(4, len(c), 2)
                    },
                )
            )
        return refs

    # -- the outbox (cross-queue fan-in, DESIGN §6) -------------------------
    def deliver(
        self,
        entries: list[dict],
        sent: dict[str, list[str]] | None = None,
        source: str | None = None,
    ) -> tuple[list[bool | None], Outcome]:
        """Deliver outbox entries (dicts ``{k, c, p, q, pol?, v?, i?}``; ``i``
        the parent's incarnation, DESIGN §6) to their
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
        replies, confirmed = self.scripts.run_many_confirmed(calls, after)
        for (_queue, idx), reply, safe in zip(groups.items(), replies, confirmed, strict=False):
            if isinstance(reply, Exception):
                raise reply
            outcome.merge(self._outcome(reply))
            data = json.loads(reply)
            for i, ok in zip(idx, data["delivered"], strict=False):
                flags[i] = bool(ok) if safe else None
            if sent is not None and data.get("sent"):
                sent.setdefault(_queue, []).extend(data["sent"])
        return flags, outcome

    def deliver_sent(self, queue: str, texts: list[str]) -> Outcome:
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
        pump to deliver again. Returns the ``Outcome``. Raises what a script
        raises, ``RedisUnavailable`` for a wait Redis did not answer.
        DESIGN §6, §10.2; the wait blocks, it does not poll (§10.1): see
        ``_wait_for_sweep_lock``."""
        if not texts:
            return Outcome()
        k, token = self.keys.queue(queue), secrets.token_hex(8)
        give_up = time.monotonic() + SENT_WAIT_S
        while not self.outbox_lock(queue, token, SENT_LOCK_MS):
            left = give_up - time.monotonic()
            if left <= 0:
                return Outcome()
            self._wait_for_sweep_lock(k, left)
        more: dict[str, list[str]] = {}
        try:
            flags, outcome = self.deliver([json.loads(t) for t in texts], more, queue)
            done = [t for t, ok in zip(texts, flags, strict=True) if ok]  # None: the pump's
            if done:
                self.scripts.run("forget_outbox", [k.outbox, k.pump_lock], [token, *done])
        finally:
            self.outbox_lock(queue, token, SENT_LOCK_MS, take=False)
        for target, pushed in more.items():  # what those deliveries sent on, one level down
            outcome.merge(self.deliver_sent(target, pushed))
        return outcome

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
        send it again. Raises ``RedisUnavailable``. DESIGN §6, §10.1."""
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

    def trim_outbox(self, queue: str, token: str, read: list, actions: list[str]) -> int:
        """Remove the outbox head the pump read (``read``: the raw entries, in
        order) once delivered: ``actions[i]`` is ``"ok"``, ``"again"`` (its
        parent was not found: to the back of the outbox, for a later sweep)
        or the reason that entry goes to the dead-letter list, which keeps its newest
        ``OUTBOX_DEADLETTER_MAX`` entries (trimmed in the same script).
        ``token`` is the sweep lock's. Returns how many entries were removed
        (0 when the head moved). Raises ``SweepLockLost`` when the lock is no
        longer ``token``'s."""
        k = self.keys.queue(queue)
        pairs = (v for pair in zip(read, actions, strict=False) for v in pair)
        return self.scripts.run(
            "trim_outbox",
            [k.outbox, k.pump_lock, k.deadletter, k.outbox_tries],
            [token, self.clock(), OUTBOX_DEADLETTER_MAX, *pairs],
        )

    def outbox_lock(self, queue: str, token: str, lease_ms: int, take: bool = True) -> bool:
        """Take (or renew) the sweep lock of ``queue``'s outbox for ``lease_ms``
        (ms) under ``token``, or with ``take=False`` drop it if it is
        ``token``'s. Returns whether the caller holds it (take) or held it
        (drop). The lock always expires; a lock already holding ``token`` is
        the caller's own (left by a drop that failed while Redis was away),
        renewed, not waited out (issue 17, item 2). A drop leaves a mark on
        ``pump_unlocked`` for a caller waiting for the lock (``deliver_sent``).
        DESIGN §6."""
        k = self.keys.queue(queue)
        return bool(
            self.scripts.run(
                "lock_outbox",
                [k.pump_lock, k.pump_unlocked],
                [token, int(lease_ms), "1" if take else "0"],
            )
        )

    def count_delivery(self, queue: str, entry: bytes | str) -> int:
        """Count one more failed delivery of an outbox ``entry`` (raw text);
        returns the count so far."""
        return self.client.hincrby(self.keys.queue(queue).outbox_tries, entry, 1)

    def outbox_length(self, queue: str) -> int:
        """How many entries ``queue``'s outbox holds."""
        return self.client.llen(self.keys.queue(queue).outbox)
