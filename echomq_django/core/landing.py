"""What ``plan()`` (``core/flows.py``) hands to the add: a checked flow as
runs of siblings (``Group``), and how the runs are cut into ``enqueue_flow``
steps (docs/explanation/protocol.md#parent-first-add). ``protocol/flows.py``
turns each step into the script's flat argument. A node's ``depends_on``
jobs become one-node groups after every other (``dependencies``), and
the flow's incarnation token (``incarnation``) its parents and children hold.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from itertools import repeat

from .exceptions import FlowError
from .jobs import Policy
from .refs import JobRef, ref_list


@dataclass(slots=True)
class Group:
    """A run of sibling nodes on one queue that share one ``enqueue_flow``
    group header (see its header): name, parent, policy, settings, options
    and incarnations. Per node it holds the id, the payload (JSON text) and
    the children as ``(queue, id)`` pairs (``()`` for a leaf). ``plan()``
    builds these directly: a 10,000-child fan-out is one group, not 10,000
    objects (docs/explanation/performance.md#the-adds-python)."""

    queue: str
    depth: int
    name: str
    parent_id: str
    parent_queue: str
    policy: str
    max_attempts: str  # '' = the queue's setting
    backoff_ms: str  # ms; '' = the queue's setting
    gate: bool  # False for ids the host generated: no need to check they are free
    opts: str  # scheduling settings as enqueue_flow's options JSON ('' = none)
    # incarnations (docs/explanation/protocol.md#incarnations): every parent gets `inc`,
    # a random token of its flow; a child on another queue than its parent is
    # sent its parent's as `parent_inc` (one on the same queue is given it by
    # enqueue_flow, which reads the parent row)
    inc: str
    parent_inc: str
    ids: list[str]
    payloads: list[str]
    children: list  # per node: a list of (queue, id), or () for a leaf

    def part(self, start: int, stop: int) -> Group:
        """Nodes ``start:stop`` of this group, as a group of their own."""
        return Group(
            self.queue,
            self.depth,
            self.name,
            self.parent_id,
            self.parent_queue,
            self.policy,
            self.max_attempts,
            self.backoff_ms,
            self.gate,
            self.opts,
            self.inc,
            self.parent_inc,
            self.ids[start:stop],
            self.payloads[start:stop],
            self.children[start:stop],
        )


def incarnation(now_ms: int) -> str:
    """A flow's incarnation token (docs/explanation/protocol.md#incarnations):
    the add's time ``now_ms`` (ms since the epoch, the time its scripts are
    given) followed by 6 random decimal digits, one integer Redis keeps in a
    hash's listpack in 9 bytes to the year 2262. A child written at that time
    holds no add time of its own: it is the token's without its last 6
    digits (docs/explanation/protocol.md#compact-rows)."""
    return f"{now_ms}{secrets.randbelow(10**6):06d}"


@dataclass
class Plan:
    """A checked flow, ready to land: its groups in landing order (breadth
    first, parents before children), and the ``(queue, id)`` of every node
    whose id the caller gave (``gated``: checked free before writing);
    ``now`` is the add's time (ms) its incarnation token carries, the time
    its writes pass their scripts (docs/explanation/protocol.md#compact-rows)."""

    groups: list[Group]
    gated: list[tuple[str, str]]
    deps: set = field(default_factory=set)  # (queue, id) of depends_on jobs: not new nodes
    now: int | None = None

    @property
    def root(self) -> tuple[str, str, list]:
        """The root's queue, id and children (``(queue, id)`` pairs)."""
        g, deps = self.groups[0], self.deps
        return g.queue, g.ids[0], [c for c in g.children[0] if c not in deps]

    @property
    def queues(self) -> list[str]:
        """The flow's queues, in order of first appearance."""
        return list(dict.fromkeys(g.queue for g in self.groups))

    def refs(self) -> list[JobRef]:
        """Every node as a ``JobRef``, in landing order."""
        # JobRef._trusted's tuple.__new__, in C calls: no Python frame per node
        new, deps = tuple.__new__, self.deps
        refs: list[JobRef] = []
        for g in self.groups:
            refs.extend(map(new, repeat(JobRef), zip(repeat(g.queue), g.ids)))
        return [r for r in refs if r not in deps] if deps else refs


def steps(plan: Plan, chunk: int) -> list[tuple[str, list[Group]]]:
    """Group a plan's groups into ``(queue, groups)`` steps.

    A flow on one queue is one step. Otherwise a step is a run of nodes of one
    queue at one depth; all of a parent's children are at the next depth, so
    every step comes after the step holding its nodes' parents. A step longer
    than ``chunk`` nodes is cut into chunks, a group cut where a chunk ends
    (docs/explanation/protocol.md#parent-first-add: a huge flow lands in
    several scripts, parents first, so no script blocks Redis for long).
    """
    groups = plan.groups
    if len({g.queue for g in groups}) == 1:
        runs = [(groups[0].queue, groups)]
    else:
        order: dict[tuple[int, str], list[Group]] = {}
        for g in groups:
            order.setdefault((g.depth, g.queue), []).append(g)
        runs = [(q, run) for (_, q), run in order.items()]
    out = []
    for queue, run in runs:
        step: list[Group] = []
        room = chunk
        for g in run:
            start, size = 0, len(g.ids)
            while start < size:
                take = min(room, size - start)
                step.append(g if take == size else g.part(start, start + take))
                start += take
                room -= take
                if not room:
                    out.append((queue, step))
                    step, room = [], chunk
        if step:
            out.append((queue, step))
    return out


DEP_OPTS = '{"dep":1}'  # enqueue_flow's options of a dependency node


def dependencies(deps: list, groups: list[Group], gated: list, token: str) -> set:
    """Append a group per ``depends_on`` job (after every other node: a
    parent is always written first) and return their ``(queue, id)``.
    A ``depends_on`` of one ``JobRef`` or ``"queue/id"`` is that job alone.
    Raises ``FlowError`` for a ref that is not a job reference, a job named
    twice, or a node of this flow (a cycle: the flow's own jobs are its
    children)."""
    own = {(g.queue, i) for g in groups for i in g.ids}
    named: set = set()
    for pq, pid, kids, refs, depth in deps:
        refs = ref_list(refs)
        if not isinstance(refs, list | tuple):
            raise FlowError(f"depends_on of {pq}/{pid} must be a list of job refs")
        for ref in refs:
            try:
                ref = as_job_ref(ref)
            except ValueError as err:
                raise FlowError(f"depends_on of {pq}/{pid}: {err}") from None
            if ref in own:
                raise FlowError(
                    f"{pq}/{pid} depends_on {ref}, a node of the same flow "
                    "(a cycle, or a child named twice): depends_on names jobs already added"
                )
            if ref in named:
                raise FlowError(
                    f"depends_on names {ref} twice: a job is waited for by one job at most"
                )
            named.add(ref)
            queue, job_id = ref
            kids.append((queue, job_id))
            gated.append((queue, job_id))
            groups.append(
                Group(
                    queue,
                    depth,
                    "",
                    pid,
                    pq,
                    Policy.FAIL_PARENT,
                    "",
                    "",
                    True,
                    DEP_OPTS,
                    "",
                    token if pq != queue else "",
                    [job_id],
                    [""],
                    [()],
                )
            )
    return {tuple(r) for r in named}


def as_job_ref(value) -> JobRef:
    """A ``JobRef``, a ``(queue, id)`` pair or ``"queue/id"`` as a
    ``JobRef``; raises ``ValueError`` naming the forms."""
    if isinstance(value, JobRef):
        return value
    if isinstance(value, tuple | list) and len(value) == 2:  # a list: read back from JSON
        return JobRef(*value)
    if isinstance(value, str):
        return JobRef.parse(value)
    raise ValueError(
        f"invalid job ref {value!r}: pass JobRef(queue, id), (queue, id) or 'queue/id'"
    )
