"""Flows (docs/explanation/house.md, "protocol/"): landing a tree of jobs
(``lua/enqueue_flow.lua``), a parent that stops waiting for some of its
children (``lua/remove_child_dependency.lua``, ``lua/drop_unprocessed.lua``),
and a running job that adds children and waits for them, a step job
(``lua/add_children.lua``, ``lua/wait_children.lua``).

``Flows`` is the part ``mq.flows``; ``EchoMQ.add_flow``, ``add_flows``,
``remove_child_dependency`` and ``remove_unprocessed_children`` hand their
calls to it. A flow on several queues lands step by step, parent first; the
results of its children reach a parent on another slot through the outbox
(``outbox.py``).
"""

from __future__ import annotations

import json

from ..core import flows as _flows
from ..core.exceptions import DependencyError, FlowConflict, JobNotActive, JobNotFound
from ..core.flows import Flow, FlowRef
from ..core.jobs import Job, JobState, to_json, to_text
from ..core.landing import DEP_OPTS as DEP
from ..core.landing import Plan, steps
from ..core.live import MAX_ADDED_CHILDREN, step_prefix
from ..core.refs import JobRef
from ..core.rows import (
    NAME,
    PARENT,
    PARENT_QUEUE,
    STATE,
    STATE_FIELDS,
    child_entries,
    parent_link,
    pick_fields,
    row_fields,
    row_state,
)
from ..tracing.spans import adding
from .wire import Part, Wire

_LINK = (STATE, PARENT, PARENT_QUEUE, NAME)  # a dependency's row, read before the add


def check_flow_list(flows) -> None:
    """``TypeError`` when ``add_flows`` is given one ``Flow``, not a list of them."""
    if isinstance(flows, Flow):
        raise TypeError("add_flows takes a list of Flow objects; for one flow, add_flow(flow)")


class Flows(Part):
    """The flow part of ``EchoMQ`` (``mq.flows``); ``reads`` is the
    ``EchoMQ`` whose read API it asks (a parent's dependencies)."""

    def __init__(self, wire: Wire, reads) -> None:
        super().__init__(wire)
        self.reads = reads

    def _step_call(
        self,
        queue: str,
        groups: list,
        mode: str,
        traceparent: str = "",
        across: bool = False,
        now: int | None = None,
    ):
        """One ``enqueue_flow`` call for a step, in the script's flat group
        format (see its header): a ``Group``'s nodes share one header.
        ``traceparent`` (W3C, '' for none) goes into every group's options
        as ``tc`` (docs/howto/tracing.md). ``across``: a child on another
        queue takes its parent's incarnation from the parent's row (ARGV[6],
        docs/explanation/protocol.md#cross-queue-scripts-on-one-server).
        ``now``: the add's time (ms, ``Plan.now``), else the clock's."""
        qk = self.keys.queue(queue)
        flat: list[str] = []
        add = flat.extend
        for g in groups:
            ids, payloads, kids = g.ids, g.payloads, g.children
            add(
                (
                    g.name,
                    g.parent_id,
                    g.parent_queue,
                    g.policy,
                    g.max_attempts,
                    g.backoff_ms,
                    "1" if g.gate else "0",
                    str(len(ids)),
                    _traced(g.opts, traceparent) if traceparent and g.opts != DEP else g.opts,
                    g.inc,
                    g.parent_inc,
                )
            )
            if not any(kids):  # leaves only: id, payload, "0" per node
                part = ["0"] * (3 * len(ids))
                part[0::3], part[1::3] = ids, payloads
                add(part)
                continue
            for job_id, payload, children in zip(ids, payloads, kids, strict=True):
                if children:  # as the parent's :children holds them (rows.child_entries)
                    entries = child_entries(queue, job_id, children)
                    add((job_id, payload, str(len(entries))))
                    add(entries)
                else:
                    add((job_id, payload, "0"))
        # one JSON argument: 9+ ARGV per node cost more in redis-py than in Redis
        now = self.clock() if now is None else now
        return (
            "enqueue_flow",
            [qk.pending, qk.awaiting],
            [queue, qk.base, now, mode, to_json(flat), "1" if across else "0"],
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
        id is gated by a read-only pass before the first write. ``TypeError``
        for one ``Flow`` instead of a list of them."""
        check_flow_list(flows)
        expiring = self._expiring()
        wire = self.wire
        now = self.clock()  # one add time: each plan's incarnation carries it
        plans = [
            _flows.plan(f, wire.encode, expiring, encode_many=wire.encode_many, now=now)
            for f in flows
        ]
        self._check_dependencies([g for p in plans if p.deps for g in p.groups if g.opts == DEP])
        seen: set = set()
        for p in plans:
            for ref in p.gated:
                if ref in seen:
                    raise _flows.FlowError(f"job id {ref[1]!r} in queue {ref[0]!r} is in two flows")
                seen.add(ref)
        if not plans:
            return []
        queue, root_id, _ = plans[0].root
        size = sum(len(g.ids) for p in plans for g in p.groups)
        with adding("add_flow", queue, root_id, size) as traceparent:
            return self._land(plans, traceparent)

    def _land(self, plans: list, traceparent: str) -> list[FlowRef]:
        """``add_many``'s writes, once every plan is checked."""
        queues = [p.queues for p in plans]
        self.wire.note_queues(dict.fromkeys(q for qs in queues for q in qs))
        all_steps = [steps(p, self.wire.flow_chunk) for p in plans]
        checks = [
            self._step_call(q, gs, "check")
            for s, p in zip(all_steps, plans, strict=True)
            if len(s) > 1 and p.gated
            for q, gs in s
        ]
        _refused_first(self.scripts.run_many(checks))
        # single-queue flows: every chunk of every such flow in one pipeline
        one_queue = [i for i, qs in enumerate(queues) if len(qs) == 1]
        calls = [
            (i, self._step_call(q, gs, "write", traceparent, now=plans[i].now))
            for i in one_queue
            for q, gs in all_steps[i]
        ]
        counts: dict[int, list] = {i: [] for i in range(len(plans))}
        for (i, _), reply in zip(calls, self.scripts.run_many([c for _, c in calls]), strict=False):
            if isinstance(reply, Exception):
                raise reply
            counts[i].append(reply)
        for i, step_list in enumerate(all_steps):
            if i in one_queue:
                continue
            counts[i] = self._run_steps(step_list, traceparent, plans[i].now)
        refs = []
        for i, p in enumerate(plans):
            queue, root_id, children = p.root
            refs.append(
                FlowRef(
                    queue=queue,
                    parent_id=root_id,
                    child_ids=[cid for _, cid in children],
                    nodes=p.refs(),
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

    def _run_steps(self, step_list: list, traceparent: str = "", now: int | None = None) -> list:
        """Write ``step_list`` (``(queue, groups)`` steps, parents first);
        returns their replies. Raises the first step's refusal. With
        ``cross_queue_scripts``: every step in one pipelined round trip, each
        child reading its parent's incarnation where it is (a step whose
        parent's step was refused writes nothing); else one call after
        another (docs/explanation/protocol.md#cross-queue-scripts-on-one-server)."""
        if self.wire.cross_queue_scripts and not self.wire.fault_hook:
            calls = [self._step_call(q, gs, "write", traceparent, True, now) for q, gs in step_list]
            return _refused_first(self.scripts.run_many(calls))
        # a parent met again keeps its incarnation: its children on
        # other queues (later steps) must carry that one, not this add's
        kept: dict[tuple[str, str], str] = {}
        replies = []
        for n, (queue, gs) in enumerate(step_list):
            if kept:
                for g in gs:
                    got = kept.get((g.parent_queue, g.parent_id))
                    if got is not None and g.parent_queue != queue:
                        g.parent_inc = got
            reply = self.scripts.run(*self._step_call(queue, gs, "write", traceparent, now=now))
            met = reply[3]
            for j in range(0, len(met), 2):
                kept[(queue, to_text(met[j]))] = to_text(met[j + 1])
            replies.append(reply)
            if self.wire.fault_hook:
                self.wire.fault_hook(n, queue, gs)
        return replies

    # -- step jobs (docs/explanation/protocol.md#step-jobs) -------------------
    def add_children(self, job: Job, children: list) -> list[JobRef]:
        """Land ``children`` (a non-empty list of ``Flow`` nodes, on any
        queue, at most ``core.live.MAX_ADDED_CHILDREN``) under ``job``, a
        running job this worker holds the lease of; returns the direct
        children's ``JobRef``\\ s. Parent first: ``lua/add_children.lua``
        counts them on the job's row under its lease, then each child lands
        as a flow node does (``enqueue_flow``, step by step), so a child never
        finishes before its parent counts it. Generated ids are derived from
        the job and this call (``core.live.step_prefix``) and landed gated:
        the run repeated after a crash adds the same children, lands those
        missing and keeps those landed (docs/explanation/protocol.md#step-jobs).
        Everything is checked before the first write. Raises ``JobNotActive`` (not a running job),
        ``LeaseLost`` (its lease was lost), ``FlowError`` / ``ValueError`` /
        ``PayloadError`` (a bad node or list), ``FlowConflict`` (an id taken);
        ``RedisUnavailable``."""
        if job.state != JobState.ACTIVE or not job.lease:
            raise JobNotActive(
                f"add_children: job {job.queue}/{job.id} is {job.state}, not a running job "
                "(children are added from inside its handler, under its lease)"
            )
        if not isinstance(children, list | tuple) or not children:
            raise _flows.FlowError("add_children takes a non-empty list of Flow nodes")
        if len(children) > MAX_ADDED_CHILDREN:
            raise _flows.FlowError(
                f"add_children got {len(children)} children: at most {MAX_ADDED_CHILDREN} a call"
            )
        for c in children:
            if not isinstance(c, Flow):
                raise _flows.FlowError(f"add_children takes Flow nodes, got {type(c).__name__}")
        root = Flow(job.queue, job.name, None, job_id=job.id, children=list(children))
        if job._adds is None:  # its row's waits: fixed while this lease holds
            job._adds = [int(self.client.hget(self.keys.job(job.queue, job.id), "waits") or 0), 0]
        waits, call = job._adds
        prefix = step_prefix(job.queue, job.id, job.created_at, waits, call)
        plan = _flows.plan(
            root, self.wire.encode, self._expiring(), prefix, self.wire.encode_many, self.clock()
        )
        job._adds[1] += 1
        head, groups = plan.groups[0], plan.groups[1:]
        for g in groups:  # a child landed before a crash is met again: skipped, not rewritten
            g.gate = True
        refs = self.keys.refs(head.children[0])
        sub = Plan(groups, [r for r in plan.gated if r != (job.queue, job.id)], plan.deps, plan.now)
        self._check_dependencies([g for g in groups if g.opts == DEP])  # a child's depends_on
        step_list = steps(sub, self.wire.flow_chunk)
        if sub.gated:
            checks = [self._step_call(q, gs, "check") for q, gs in step_list]
            _refused_first(self.scripts.run_many(checks))
        reply = self.scripts.run(
            "add_children",
            [self.keys.job(job.queue, job.id)],
            [job.queue, job.id, job.lease, head.inc, *refs],
        )
        self.wire.note_queues(dict.fromkeys(sub.queues))
        inc = to_text(reply[0])
        for g in groups:
            if g.parent_id == job.id and g.parent_queue == job.queue and g.queue != job.queue:
                g.parent_inc = inc
        self._run_steps(step_list, now=plan.now)
        return [JobRef._trusted(q, i) for q, i in head.children[0]]

    def wait_for_children(self, job: Job) -> JobState:
        """End ``job``'s attempt held until its children resolve (its
        handler raised ``WaitForChildren``), under its lease
        (``lua/wait_children.lua``): the attempt is taken back. Returns the
        state it left the job in: ``AWAITING_CHILDREN``, ``PENDING`` (every
        child resolved already: it runs again), ``DELAYED`` (the same, with
        a ``delay_until`` ahead) or ``DEAD`` (an ``fp`` child died, or a
        cancel mark). Raises ``JobNotFound``, ``JobNotActive``, ``LeaseLost``
        (nothing written); ``RedisUnavailable``."""
        k = self.keys.queue(job.queue)
        state = self.scripts.run(
            "wait_children",
            [k.job(job.id), k.active, k.awaiting],
            [job.queue, k.base, job.id, job.lease or "", self.clock()],
        )
        return JobState(to_text(state))

    def _expiring(self) -> dict:
        """``{queue: EXPIRES_MS}`` of the queues that set one (docs/howto/retries.md)."""
        expiring = {q: (o or {}).get("EXPIRES_MS") for q, o in self.wire.queues.items()}
        return {q: ms for q, ms in expiring.items() if ms}

    def _check_dependencies(self, groups: list) -> None:
        """Every ``depends_on`` job (a dependency group: one node each)
        exists and is waited for by no other job, read before any write
        (``enqueue_flow`` checks again on its slot). Raises ``JobNotFound``
        / ``FlowConflict`` naming the rule."""
        if not groups:
            return
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            pipe.hmget(self.keys.job(g.queue, g.ids[0]), *row_fields(_LINK))
        for g, (state, parent, pq, name) in zip(
            groups, (pick_fields(_LINK, f) for f in pipe.execute()), strict=True
        ):
            where = f"{g.parent_queue}/{g.parent_id} depends_on {g.queue}/{g.ids[0]}"
            if state is None and name is None:  # every row holds its handler
                raise JobNotFound(f"{where}: no such job (a dependency is a job already added)")
            parent, pq = parent_link(g.ids[0], parent, pq)
            owner = f"{pq or g.queue}/{parent}"
            if parent is not None and owner != f"{g.parent_queue}/{g.parent_id}":
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
        is deleted on its own slot. Children that are running, parents (held
        for children of their own, or released by them) or finished are
        left as they are, and waited for. Returns
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
            pipe = self.client.pipeline(transaction=False)
            for _, cid in items:
                keys = self.keys.job_keys(cq, cid)
                pipe.hmget(keys.row, *STATE_FIELDS)
                pipe.exists(keys.children)  # a parent its children released: left alone
            replies = pipe.execute()
            for (ref, _), st, kids in zip(items, replies[::2], replies[1::2], strict=True):
                states[ref] = None if kids else to_text(row_state(st))
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


def _refused_first(replies: list) -> list:
    """``replies`` of a ``run_many``, once none is an exception: raises the
    first one (a step's refusal, ``EMQ...`` translated) otherwise."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _traced(opts: str, traceparent: str) -> str:
    """A group's options JSON ('' or an object) with ``tc`` set to
    ``traceparent`` (hex digits and dashes: nothing to escape)."""
    tail = f'"tc":"{traceparent}"}}'
    return f"{opts[:-1]},{tail}" if opts else "{" + tail
