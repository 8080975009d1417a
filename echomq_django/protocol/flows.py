"""Flows (docs/explanation/house.md, "protocol/"): landing a tree of jobs
(``lua/enqueue_flow.lua``), and a parent that stops waiting for some of its
children (``lua/remove_child_dependency.lua``, ``lua/drop_unprocessed.lua``).

``Flows`` is the part ``mq.flows``; ``EchoMQ.add_flow``, ``add_flows``,
``remove_child_dependency`` and ``remove_unprocessed_children`` hand their
calls to it. A flow on several queues lands step by step, parent first; the
results of its children reach a parent on another slot through the outbox
(``outbox.py``).
"""

from __future__ import annotations

import itertools
import json

from ..core import flows as _flows
from ..core.exceptions import DependencyError, FlowConflict, JobNotFound
from ..core.flows import Flow, FlowRef
from ..core.jobs import to_json, to_text
from ..core.refs import JobRef
from .wire import Part, Wire, opt


class Flows(Part):
    """The flow part of ``EchoMQ`` (``mq.flows``); ``reads`` is the
    ``EchoMQ`` whose read API it asks (a parent's dependencies)."""

    def __init__(self, wire: Wire, reads) -> None:
        super().__init__(wire)
        self.reads = reads

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
                if n.children or n.deps:
                    refs = k.refs(n.children + n.deps if n.deps else n.children)
                    flat += [n.id, n.payload, str(len(refs)), *refs]
                else:
                    flat += [n.id, n.payload, "0"]
        # one JSON argument: 9+ ARGV per node cost more in redis-py than in Redis
        return (
            "enqueue_flow",
            [qk.pending, qk.awaiting],
            [queue, qk.base, self.clock(), mode, to_json(flat)],
        )

    def add(self, flow: Flow) -> FlowRef:
        """Land a flow (a tree of ``Flow`` nodes); returns its ``FlowRef``.

        One queue: one atomic script. Several queues: parent first, one script
        per (depth, queue) step, stopping at the first error with every parent
        already landed held (docs/explanation/protocol.md); adding the same flow again completes
        it, skipping rows already there. Raises ``FlowError`` (duplicate ids,
        cycle), ``ValueError`` (names), ``PayloadError``, ``FlowConflict`` (an
        id taken by another job or flow: nothing written when found before
        the first write), ``RedisUnavailable``.
        """
        return self.add_many([flow])[0]

    def add_many(self, flows: list[Flow]) -> list[FlowRef]:
        """Land several flows. Every flow on a single queue goes in one
        pipelined round trip (its chunks in order: one slot, one connection);
        a cross-queue flow lands step by step, parent first. Same errors as
        ``add_flow``; when a flow takes more than one script, every user-given
        id is gated by a read-only pass before the first write."""
        plans = [_flows.plan(f, self.wire.encode) for f in flows]
        self._check_dependencies([n for nodes in plans for n in nodes if n.dep])
        seen: set = set()
        for nodes in plans:
            for n in nodes:
                if n.gate:
                    if (n.queue, n.id) in seen:
                        raise _flows.FlowError(
                            f"job id {n.id!r} in queue {n.queue!r} is in two flows"
                        )
                    seen.add((n.queue, n.id))
        self.wire.note_queues(dict.fromkeys(n.queue for nodes in plans for n in nodes))
        all_steps = [_flows.steps(nodes, self.wire.flow_chunk) for nodes in plans]
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
                if self.wire.fault_hook:
                    self.wire.fault_hook(n, queue, ns)
        refs = []
        for i, nodes in enumerate(plans):
            root = nodes[0]
            refs.append(
                FlowRef(
                    queue=root.queue,
                    parent_id=root.id,
                    child_ids=[cid for _, cid in root.children],
                    nodes=[JobRef._trusted(n.queue, n.id) for n in nodes if not n.dep],
                    landed=sum(int(c[0]) for c in counts[i]),
                    skipped=sum(int(c[1]) for c in counts[i]),
                    deduplicated={
                        JobRef._trusted(q, to_text(c[j])): to_text(c[j + 1])
                        for c, (q, _) in zip(counts[i], all_steps[i], strict=True)
                        for j in range(4, len(c), 2)
                    },
                )
            )
        return refs

    def _check_dependencies(self, deps: list) -> None:
        """Every ``depends_on`` job exists and is waited for by no other job,
        read before any write (``enqueue_flow`` checks again on its slot).
        Raises ``JobNotFound`` / ``FlowConflict`` naming the rule."""
        if not deps:
            return
        pipe = self.client.pipeline(transaction=False)
        for n in deps:
            pipe.hmget(self.keys.job(n.queue, n.id), "state", "parent", "parent_queue")
        for n, (state, parent, pq) in zip(deps, pipe.execute(), strict=True):
            where = f"{n.parent_queue}/{n.parent_id} depends_on {n.queue}/{n.id}"
            if state is None:
                raise JobNotFound(f"{where}: no such job (a dependency is a job already added)")
            owner = f"{to_text(pq) or n.queue}/{to_text(parent)}"
            if parent is not None and owner != f"{n.parent_queue}/{n.parent_id}":
                raise FlowConflict(
                    f"{where}: it is already waited for by {owner} (a job is waited for "
                    "by one job at most)"
                )

    # -- flow control --------------------------------------------------------
    def _remove_dependencies(self, queue: str, parent_id: str, refs: list[str], strict: bool):
        k = self.keys
        reply = self.scripts.run(
            "remove_child_dependency",
            [k.job(queue, parent_id)],
            [queue, k.base(queue), parent_id, self.clock(), "1" if strict else "0", *refs],
        )
        return json.loads(reply).get("removed") or [], self.wire.outcome(reply)

    def remove_child_dependency(self, queue: str, parent_id: str, child: JobRef):
        """The parent ``queue/parent_id`` stops waiting for ``child`` (a
        ``JobRef``; ``EchoMQ.remove_child_dependency`` takes the other forms):
        recorded in the parent's ``:removed``, counter decremented, the parent
        released at zero. The child is not touched; if it finishes later its
        fan-in changes nothing. Returns the ``Outcome`` (``released``).
        Raises ``JobNotFound`` (no parent), ``JobNotActive`` (the parent is not
        awaiting_children), ``DependencyError`` (not an unresolved child),
        ``ValueError`` (a bad name). docs/howto/priorities-rate-limits.md#flow-control"""
        key = self.keys.job(*child)
        try:
            return self._remove_dependencies(queue, parent_id, [key], True)[1]
        except DependencyError as err:  # the script names the child by its key
            raise DependencyError(str(err).replace(key, str(child))) from None

    def remove_unprocessed_children(self, queue: str, parent_id: str):
        """Remove the children of a held parent that have not started (pending
        or delayed), on any queue: the parent stops waiting for them first
        (so a crash halfway never leaves it waiting for ever), then each one
        is deleted on its own slot. Children that are running, held (waiting
        for children of their own) or finished are left as they are. Returns
        ``(deleted, outcome)``: the ``JobRef``\\ s deleted and the
        ``Outcome`` (``released`` when the parent went on). Raises
        ``JobNotFound`` / ``JobNotActive`` like ``remove_child_dependency``.
        docs/howto/priorities-rate-limits.md#flow-control"""
        deps = self.reads.dependencies(queue, parent_id)
        by_queue: dict[str, list[tuple[str, str]]] = {}
        for cq, cid in deps.unprocessed:
            by_queue.setdefault(cq, []).append((self.keys.job(cq, cid), cid))
        states = {}
        for cq, items in by_queue.items():
            rows = [self.keys.job(cq, cid) for _, cid in items]
            pipe = self.client.pipeline(transaction=False)
            for row in rows:
                pipe.hget(row, "state")
            for (ref, _), st in zip(items, pipe.execute(), strict=True):
                states[ref] = st.decode() if isinstance(st, bytes) else st
        waiting = [ref for ref, st in states.items() if st in ("pending", "delayed")]
        removed, outcome = self._remove_dependencies(queue, parent_id, waiting, False)
        k, calls, queues = self.keys, [], []
        for cq, items in by_queue.items():
            ids = [cid for ref, cid in items if ref in removed]
            if ids:
                queues.append(cq)
                calls.append(
                    (
                        "drop_unprocessed",
                        [k.queue(cq).pending, k.queue(cq).delayed],
                        [k.base(cq), parent_id, queue, *ids],
                    )
                )
        dropped = []
        for cq, reply in zip(queues, self.scripts.run_many(calls), strict=True):
            if isinstance(reply, Exception):
                raise reply
            dropped += [JobRef._trusted(cq, to_text(i)) for i in reply]
        return dropped, outcome
