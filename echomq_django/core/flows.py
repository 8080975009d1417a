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


def assign_ids(flow: Flow) -> None:
    """Give every node of ``flow`` without a ``job_id`` a fresh one (the
    commit outbox fixes a flow's ids before it is written)."""
    stack, seen = [flow], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, Flow) or id(node) in seen:
            continue  # plan() reports these
        seen.add(id(node))
        if node.job_id is None:
            node.job_id = new_id()
        stack.extend(node.children)


def id_prefix() -> str:
    """The prefix of one flow's generated ids: 12 random URL-safe characters
    (72 bits, fresh per flow), followed in each id by a hex counter. Cheaper
    than a random id per node, and as unique: two flows share a prefix with
    odds of 2**-72."""
    return secrets.token_urlsafe(9)


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

    ``depends_on``: jobs already added (``JobRef``, ``(queue, id)`` or
    ``"queue/id"``, on any queue) this node waits for as well as its
    children, each a dependency of the default policy (a dead one fails
    this node); each must exist and be waited for by no other job. One
    already finished counts at once (docs/howto/canvas.md#depends-on-existing-jobs).
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
    depends_on: list = field(default_factory=list)

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
class Node:
    """A planned node: everything ``enqueue_flow`` needs for one row."""

    queue: str
    id: str
    name: str
    payload: str
    max_attempts: int | None
    backoff_ms: int | None
    parent_id: str
    parent_queue: str
    policy: Policy
    children: list[tuple[str, str]]
    depth: int
    gate: bool = True  # False for an id the host generated: no need to check it is free
    opts: str = ""  # scheduling settings as enqueue_flow's options JSON ('' = none)
    # incarnations (docs/explanation/protocol.md#incarnations): every parent gets `inc`,
    # a random token of its flow; a child on another queue than its parent is
    # sent its parent's as `parent_inc` (one on the same queue is given it by
    # enqueue_flow, which reads the parent row)
    inc: str = ""
    parent_inc: str = ""
    dep: bool = False  # an existing job this node's parent waits for (depends_on)
    deps: list = field(default_factory=list)  # (queue, id) of this node's dependencies


def plan(root: Flow, encode) -> list[Node]:
    """Assign ids, validate and order a flow's nodes breadth first.

    ``encode(payload) -> str`` serialises a payload (raising ``PayloadError``).
    Raises ``FlowError`` for
    a node that is not a ``Flow``, an id used twice in one queue, or a cycle;
    ``ValueError`` for a bad queue name or id (a bad job name is a
    ``FlowError``, a ``ValueError`` too). Nothing is written here: every
    node is checked before the first script runs
    (docs/explanation/reliability.md#bad-input-writes-nothing).
    """
    if not isinstance(root, Flow):
        raise FlowError(f"add_flow takes a Flow, got {type(root).__name__}")
    nodes: list[Node] = []
    seen: set[tuple[str, str]] = set()
    objects: set[int] = set()
    queues: set[str] = set()  # validated once per queue
    dedups: set[tuple[str, str]] = set()  # (queue, dedup key): one leaf per key in a flow
    names: set[str] = set()  # and once per job name
    prefix, counter = id_prefix(), itertools.count()
    token = secrets.token_hex(4)  # the flow's incarnation token (32 random bits)
    level: list[tuple[Flow, Node | None]] = [(root, None)]
    deps: list = []  # (node, its depends_on, the depth below it)
    depth = 0
    # The loop runs once per node of flows of 10,000+: it avoids calls it can
    # (docs/explanation/performance.md#where-the-time-goes), e.g. the common defaults are
    # tested inline before validating.
    while level:
        next_level = []
        for flow, parent in level:
            if type(flow) is not Flow and not isinstance(flow, Flow):
                raise FlowError(
                    f"a flow's children must be Flow objects, got {type(flow).__name__}"
                )
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
            else:
                job_id = f"{prefix}{next(counter):x}"
            if name not in names:  # validated once per name: flows share a few
                if type(name) is not str or not name:
                    raise FlowError(f"flow node {queue}/{job_id} needs a job name (the handler)")
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
            _check_settings(flow, queue, job_id)
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
                else node_options(
                    flow, f"{queue}/{job_id}", bool(children or flow.depends_on), dedups
                )
            )
            node = Node(
                queue,
                job_id,
                name,
                encode(flow.payload),
                flow.max_attempts,
                flow.backoff_ms,
                parent.id if parent else "",
                parent.queue if parent else "",
                flow.policy if parent else _FP,
                [],
                depth,
                gate,
                opts,
            )
            if parent is not None:
                parent.children.append((queue, job_id))
                parent.inc = token
                if parent.queue != queue:
                    node.parent_inc = token
            nodes.append(node)
            if children:
                next_level.extend((child, node) for child in children)
            if flow.depends_on:
                deps.append((node, flow.depends_on, depth + 1))
        level = next_level
        depth += 1
    if deps:
        nodes += _dependencies(deps, nodes, token)
    return nodes


def _dependencies(deps: list, nodes: list[Node], token: str) -> list[Node]:
    """The dependency nodes of ``depends_on`` (after every other node: a
    parent is always written first). Raises ``FlowError`` for a ref that is
    not a job reference, a job named twice, or a node of this flow (a
    cycle: the flow's own jobs are its children)."""
    own = {(n.queue, n.id) for n in nodes}
    named: set[tuple[str, str]] = set()
    out = []
    for parent, refs, depth in deps:
        if not isinstance(refs, list | tuple):
            raise FlowError(f"depends_on of {parent.queue}/{parent.id} must be a list of job refs")
        for ref in refs:
            try:
                ref = as_job_ref(ref)
            except ValueError as err:
                raise FlowError(f"depends_on of {parent.queue}/{parent.id}: {err}") from None
            if ref in own:
                raise FlowError(
                    f"{parent.queue}/{parent.id} depends_on {ref}, a node of the same flow "
                    "(a cycle, or a child named twice): depends_on names jobs already added"
                )
            if ref in named:
                raise FlowError(
                    f"depends_on names {ref} twice: a job is waited for by one job at most"
                )
            named.add(ref)
            node = Node(*ref, "", "", None, None, parent.id, parent.queue, _FP, [], depth)
            node.dep, node.opts = True, DEP_OPTS
            parent.deps.append(ref)
            parent.inc = token
            if parent.queue != ref.queue:
                node.parent_inc = token
            out.append(node)
    return out


DEP_OPTS = '{"dep":1}'  # enqueue_flow's options of a dependency node


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


def steps(nodes: list[Node], chunk: int) -> list[tuple[str, list[Node]]]:
    """Group breadth-first nodes into ``(queue, nodes)`` steps.

    A flow on one queue is one step. Otherwise a step is a run of nodes of one
    queue at one depth; all of a parent's children are at the next depth, so
    every step comes after the step holding its nodes' parents. A step longer
    than ``chunk`` nodes is cut into chunks
    (docs/explanation/protocol.md#parent-first-add: a huge flow lands in
    several scripts, parents first, so no script blocks Redis for long).
    """
    if len({n.queue for n in nodes}) == 1:
        groups = [(nodes[0].queue, nodes)]
    else:
        order: dict[tuple[int, str], list[Node]] = {}
        for n in nodes:
            order.setdefault((n.depth, n.queue), []).append(n)
        groups = [(q, group) for (_, q), group in order.items()]
    out = []
    for queue, group in groups:
        for i in range(0, len(group), chunk):
            out.append((queue, group[i : i + chunk]))
    return out
