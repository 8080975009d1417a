"""Flows: the tree a user describes, and how it is landed (docs/explanation/protocol.md#flows).

A ``Flow`` is a job plus its children, which may be flows themselves. Landing
it is planned here and executed by ``EchoMQ.add_flow``:

* every node gets an id (given or generated) and is checked: no id twice in a
  queue, no cycle, valid queue names, ids and JSON payloads;
* nodes are ordered breadth first, so every parent is written before any of
  its children (docs/explanation/protocol.md#parent-first-add);
* consecutive nodes on the same queue form one step: one ``enqueue_flow``
  script on that queue's slot. A flow whose nodes share one queue is one step,
  hence atomic; a cross-queue flow is one step per (depth, queue).
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from .exceptions import FlowError
from .jobs import Policy
from .keyspace import validate_id, validate_name, validate_queue, whole_number
from .options import node_options
from .refs import JobRef

# Module globals: an Enum member lookup costs ~0.3 us, and plan() reads a
# policy per node (3 ms on a 1+10,000 flow).
_CP, _ID, _RD, _FP = Policy.CONTINUE_PARENT, Policy.IGNORE, Policy.REMOVE, Policy.FAIL_PARENT


def new_id() -> str:
    """A fresh job id: 16 URL-safe characters (96 random bits)."""
    return secrets.token_urlsafe(12)


def id_prefix() -> str:
    """The prefix of one flow's generated ids: 12 random URL-safe characters
    (72 bits, fresh per flow), followed in each id by a hex counter. Cheaper
    than a random id per node, and as unique: two flows share a prefix with
    odds of 2**-72."""
    return secrets.token_urlsafe(9)


def incarnation() -> str:
    """A flow's incarnation token (docs/explanation/protocol.md#incarnations):
    a decimal integer from 1 to 2**31 - 1 (31 random bits). Redis keeps an
    integer in a hash's listpack in 5 bytes where 8 hex characters take 9, and
    on every parent and child row that decides a 128- or 160-byte row
    (docs/explanation/performance.md#memory-per-node)."""
    return str(secrets.randbelow(2**31 - 1) + 1)


@dataclass
class Flow:
    """One node of a flow: a job and its children (docs/explanation/protocol.md#flows).

    ``queue`` and ``name`` (the handler) are required; ``payload`` is any
    JSON-serialisable value; ``job_id`` defaults to a generated id. The three
    failure flags say what this node's death means for its parent (seeds 000
    and 003): ``fail_parent_on_failure`` is the default;
    ``ignore_dependency_on_failure=True`` wins over the others;
    ``remove_dependency_on_failure=True`` unlinks it without a record.
    ``max_attempts`` / ``backoff_ms`` (ms) default to the queue's settings.

    Scheduling (docs/howto/priorities-rate-limits.md, ``core/options.py`` checks them): ``priority``
    (int, higher runs first, default 0); ``delay_ms`` (ms; a delayed parent
    waits for its children and its delay); ``timeout_ms`` (ms per attempt;
    default the queue's TIMEOUT_MS); ``dedup_key`` / ``dedup_ttl_ms`` (leaf
    nodes only: a leaf whose key names a live job is not added, and its parent
    stops waiting for it); ``children_timeout_ms`` (parents only: children
    not all resolved in time kill the parent with ``children timed out``);
    ``continue_parent_on_failure=True`` (this child's death releases its
    parent at once; it cannot be combined with the ignore / remove flags).
    """

    queue: str
    name: str
    payload: Any = None
    job_id: str | None = None
    children: list[Flow] = field(default_factory=list)
    fail_parent_on_failure: bool = True
    ignore_dependency_on_failure: bool = False
    remove_dependency_on_failure: bool = False
    max_attempts: int | None = None
    backoff_ms: int | None = None
    priority: int = 0
    delay_ms: int = 0
    timeout_ms: int | None = None
    dedup_key: str | None = None
    dedup_ttl_ms: int | None = None
    children_timeout_ms: int | None = None
    keep: int | None = None  # s after it finishes, at most; None: the queue's
    continue_parent_on_failure: bool = False

    @property
    def policy(self) -> Policy:
        """The ``Policy`` this node carries (continue, then ignore, win)."""
        if self.continue_parent_on_failure:
            return _CP
        if self.ignore_dependency_on_failure:
            return _ID
        if self.remove_dependency_on_failure:
            return _RD
        return _FP


@dataclass
class FlowRef:
    """What ``add_flow`` landed: the root's queue and id, its direct
    children's ids, every node as a ``JobRef`` in landing order, how
    many rows were written (``landed``) or already there (``skipped``), and
    the leaves not added because their dedup key names a live job:
    ``{JobRef of the leaf: live job id}`` (docs/explanation/protocol.md#scheduling). ``ref`` is the
    root's ``JobRef``, ``children`` its direct children's
    (docs/howto/read-flows.md#job-references). A ``JobRef`` is a ``(queue, id)`` tuple,
    so code that compared ``nodes`` with pairs still works."""

    queue: str
    parent_id: str
    child_ids: list[str]
    nodes: list[JobRef]
    landed: int = 0
    skipped: int = 0
    deduplicated: dict[JobRef, str] = field(default_factory=dict)

    @property
    def ref(self) -> JobRef:
        """The root job as a ``JobRef``."""
        return JobRef(self.queue, self.parent_id)

    @property
    def children(self) -> list[JobRef]:
        """The root's direct children as ``JobRef``\\ s, in the flow's order
        (``nodes`` lists them right after the root)."""
        return self.nodes[1 : 1 + len(self.child_ids)]


@dataclass(slots=True)
class Group:
    """A run of sibling nodes on one queue that share one ``enqueue_flow``
    group header (see its header): name, parent, policy, settings, options
    and incarnations. Per node it holds the id, the payload (JSON text) and
    the children as ``(queue, id)`` pairs (``()`` for a leaf). ``plan()``
    builds these directly: a 10,000-child fan-out is one group, not 10,000
    objects (docs/explanation/performance.md#where-the-time-goes)."""

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


@dataclass
class Plan:
    """A checked flow, ready to land: its groups in landing order (breadth
    first, parents before children), and the ``(queue, id)`` of every node
    whose id the caller gave (``gated``: checked free before writing)."""

    groups: list[Group]
    gated: list[tuple[str, str]]

    @property
    def root(self) -> tuple[str, str, list]:
        """The root's queue, id and children (``(queue, id)`` pairs)."""
        g = self.groups[0]
        return g.queue, g.ids[0], list(g.children[0])

    @property
    def queues(self) -> list[str]:
        """The flow's queues, in order of first appearance."""
        return list(dict.fromkeys(g.queue for g in self.groups))

    def refs(self) -> list[JobRef]:
        """Every node as a ``JobRef``, in landing order."""
        trusted = JobRef._trusted
        return [trusted(g.queue, i) for g in self.groups for i in g.ids]


_LEAF = ()  # the children of every leaf: one shared empty tuple
# the common failure flags and settings, as plan() keys them
_DEFAULTS = (True, False, False, False, None, type(None), None, type(None))


def plan(root: Flow, encode) -> Plan:
    """Assign ids, validate and order a flow's nodes breadth first.

    ``encode(payload) -> str`` serialises a payload (raising ``PayloadError``).
    Raises ``FlowError`` for
    a node that is not a ``Flow``, an id used twice in one queue, or a cycle;
    ``ValueError`` for a bad queue name or id (a bad job name is a
    ``FlowError``, a ``ValueError`` too). Nothing is written here: every
    node is checked before the first script runs
    (docs/explanation/reliability.md#bad-input-writes-nothing). Queue
    names, job names and the failure settings are checked once per distinct
    value; ids, payloads and options once per node.
    """
    if not isinstance(root, Flow):
        raise FlowError(f"add_flow takes a Flow, got {type(root).__name__}")
    groups: list[Group] = []
    gated: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    objects: set[int] = {id(root)}
    queues: set[str] = set()  # validated once per queue
    names: set[str] = set()  # and once per job name
    settings: set[tuple] = {_DEFAULTS}  # and once per set of failure flags and settings
    dedups: set[tuple[str, str]] = set()  # (queue, dedup key): one leaf per key in a flow
    prefix, counter = id_prefix(), itertools.count()
    token = incarnation()
    # a level: (parent queue, parent id, the parent's children list, its Flow children)
    level: list[tuple[str, str, list | None, list]] = [("", "", None, [root])]
    depth = 0
    # The loop runs once per node of flows of 10,000+: it avoids calls it can
    # (docs/explanation/performance.md#where-the-time-goes): no object per node, the
    # common defaults tested inline, each distinct name and setting checked once.
    while level:
        next_level = []
        for pq, pid, kids, flows in level:
            group, group_key = None, None  # a new group per parent
            for flow in flows:
                if type(flow) is not Flow and not isinstance(flow, Flow):
                    raise FlowError(
                        f"a flow's children must be Flow objects, got {type(flow).__name__}"
                    )
                if kids is not None:  # the root is in objects already
                    if id(flow) in objects:
                        raise FlowError(
                            f"flow node {flow.queue}/{flow.name} appears twice (a cycle, or "
                            "one node under two parents); a flow is a tree"
                        )
                    objects.add(id(flow))
                queue, job_id, name = flow.queue, flow.job_id, flow.name
                if queue not in queues:
                    queues.add(validate_queue(queue))
                gate = job_id is not None
                if gate:  # generated ids are unique by construction
                    validate_id(job_id)
                    if (queue, job_id) in seen:
                        raise FlowError(
                            f"job id {job_id!r} appears twice in queue {queue!r} in one "
                            "flow; every node needs its own id"
                        )
                    seen.add((queue, job_id))
                    gated.append((queue, job_id))
                else:
                    job_id = f"{prefix}{next(counter):x}"
                if name not in names:  # validated once per name: flows share a few
                    if type(name) is not str or not name:
                        raise FlowError(
                            f"flow node {queue}/{job_id} needs a job name (the handler)"
                        )
                    try:
                        names.add(validate_name(name))
                    except ValueError as err:
                        raise FlowError(f"flow node {queue}/{job_id}: {err}") from None
                children = flow.children
                if type(children) is not list and not isinstance(children, list | tuple):
                    raise FlowError(
                        f"children of {queue}/{job_id} must be a list of Flow, "
                        f"got {type(children).__name__}"
                    )
                cont, ignore, remove = (
                    flow.continue_parent_on_failure,
                    flow.ignore_dependency_on_failure,
                    flow.remove_dependency_on_failure,
                )
                ma, bo = flow.max_attempts, flow.backoff_ms
                # the types too: True == 1 and 2.0 == 2, yet only an int is a number of attempts
                what = (
                    flow.fail_parent_on_failure,
                    ignore,
                    remove,
                    cont,
                    ma,
                    type(ma),
                    bo,
                    type(bo),
                )
                if what not in settings:
                    _check_settings(flow, queue, job_id)
                    settings.add(what)
                opts = (
                    ""
                    if not (
                        flow.priority
                        or flow.delay_ms
                        or flow.timeout_ms is not None
                        or flow.dedup_key is not None
                        or flow.dedup_ttl_ms is not None
                        or flow.children_timeout_ms is not None
                        or flow.keep is not None
                    )
                    else node_options(flow, f"{queue}/{job_id}", bool(children), dedups)
                )
                payload = encode(flow.payload)
                if kids is None:
                    policy = _FP
                else:
                    policy = _CP if cont else _ID if ignore else _RD if remove else _FP
                    kids.append((queue, job_id))
                mine: list | tuple = [] if children else _LEAF
                inc = token if children else ""
                key = (queue, name, policy, opts, inc, gate, ma, bo)
                if key != group_key:
                    group_key = key
                    group = Group(
                        queue,
                        depth,
                        name,
                        pid,
                        pq,
                        policy,
                        opt_text(ma),
                        opt_text(bo),
                        gate,
                        opts,
                        inc,
                        token if kids is not None and pq != queue else "",
                        [],
                        [],
                        [],
                    )
                    groups.append(group)
                group.ids.append(job_id)
                group.payloads.append(payload)
                group.children.append(mine)
                if children:
                    next_level.append((queue, job_id, mine, children))
        level = next_level
        depth += 1
    return Plan(groups, gated)


def opt_text(value) -> str:
    """An optional integer as script text: '' means "the queue's setting"."""
    return "" if value is None else str(int(value))


def _check_settings(flow: Flow, queue: str, job_id: str) -> None:
    if flow.continue_parent_on_failure and (
        flow.ignore_dependency_on_failure or flow.remove_dependency_on_failure
    ):
        raise FlowError(
            f"{queue}/{job_id}: continue_parent_on_failure cannot be combined with "
            "ignore_dependency_on_failure or remove_dependency_on_failure (one policy per child)"
        )
    if not (
        flow.fail_parent_on_failure
        or flow.ignore_dependency_on_failure
        or flow.remove_dependency_on_failure
        or flow.continue_parent_on_failure
    ):
        raise FlowError(
            f"{queue}/{job_id}: fail_parent_on_failure=False needs "
            "ignore_dependency_on_failure or remove_dependency_on_failure "
            "(what else should its death do to the parent?)"
        )
    if flow.max_attempts is None and flow.backoff_ms is None:
        return
    try:
        whole_number("max_attempts", flow.max_attempts, 1, optional=True)
        whole_number("backoff_ms", flow.backoff_ms, 0, optional=True)
    except ValueError as err:
        raise FlowError(f"{queue}/{job_id}: {err}") from None


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
