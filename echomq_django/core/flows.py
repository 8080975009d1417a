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

import secrets
import time
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter
from typing import Any

from .exceptions import FlowError
from .jobs import Policy
from .keyspace import validate_id, validate_name, validate_queue
from .landing import Group, Plan, dependencies, incarnation
from .options import check_node_settings, node_options, opt_text
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

    Retries (docs/howto/retries.md, ``core/retry.py`` checks them):
    ``backoff``, ``jitter``, ``retry_on``, ``dont_retry_on``, ``expires_ms``
    (ms after it is due; not started by then, it dies ``expired``), and the
    callbacks ``on_success`` / ``on_failure`` / ``on_dead`` (a handler name,
    or a ``(queue, name)`` pair for a job on another queue).

    ``group`` (str, ``keyspace.GROUP_RULE``; None: none): the node is claimed
    in its group's turn (docs/explanation/protocol.md#groups).

    ``depends_on``: jobs already added (a list of ``JobRef``, ``(queue, id)``
    or ``"queue/id"``, on any queue, or one ``JobRef`` or ``"queue/id"``) this
    node waits for as well as its
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
    # docs/howto/retries.md: ms after it is due; None: the queue's EXPIRES_MS
    expires_ms: int | None = None
    backoff: Any = None  # its own retry policy; None: the queue's (core/retry.py)
    jitter: float | None = None
    retry_on: Any = None
    dont_retry_on: Any = None
    # handler names its outcomes add a job for (docs/howto/retries.md#callbacks)
    on_success: str | tuple | None = None
    on_failure: str | tuple | None = None
    on_dead: str | tuple | None = None
    depends_on: list = field(default_factory=list)
    group: str | None = None  # docs/explanation/protocol.md#groups

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


_LEAF = ()  # the children of every leaf: one shared empty tuple
# the common failure flags and settings, as plan() keys them
_DEFAULTS = (True, False, False, False, True, None, type(None), None, type(None))
# a node's parts, and its settings and options, each in one C call
_core = attrgetter("queue", "job_id", "name", "children", "payload")
_payload = attrgetter("payload")
_SETTINGS = (
    "fail_parent_on_failure",
    "ignore_dependency_on_failure",
    "remove_dependency_on_failure",
    "continue_parent_on_failure",
    "max_attempts",
    "backoff_ms",
    "priority",
    "delay_ms",
    "timeout_ms",
    "dedup_key",
    "dedup_ttl_ms",
    "children_timeout_ms",
    "keep",
    # its own retry policy, expiry and callbacks (docs/howto/retries.md)
    "expires_ms",
    "backoff",
    "jitter",
    "retry_on",
    "dont_retry_on",
    "on_success",
    "on_failure",
    "on_dead",
    "group",  # docs/explanation/protocol.md#groups
)
_settings = attrgetter(*_SETTINGS)
_shape = attrgetter("queue", "job_id", "name", "children", "depends_on", *_SETTINGS)
_FIELDS = frozenset(f.name for f in fields(Flow))  # a node's __dict__ keys, as __init__ sets them
_BUT_PAYLOAD = attrgetter(*sorted(_FIELDS - {"payload"}))
# a node that sets none of them (falsy priority and delay_ms, as node_options reads them)
_NO_RETRY = (None,) * 9  # and no group
_PLAIN = (True, False, False, False, None, None, 0, 0, None, None, None, None, None, *_NO_RETRY)


def plan(
    root: Flow, encode, expiring: dict | None = None, prefix=None, encode_many=None, now=None
) -> Plan:
    """Assign ids, validate and order a flow's nodes breadth first; returns
    the ``Plan``: runs of siblings (``Group``) in landing order, parents first.

    ``encode(payload) -> str`` serialises a payload (raising ``PayloadError``);
    ``encode_many(payloads) -> list[str]`` (optional, ``Wire.encode_many``)
    does a list of them at once, with the same errors;
    ``expiring`` maps a queue to its EXPIRES_MS (ms), for the queues that set it;
    ``prefix`` (12 URL-safe characters, ``core.live.step_prefix``) replaces the random
    ``id_prefix()`` of the generated ids; ``now`` (ms since the epoch, default
    the wall clock's) is the add's time its incarnation token carries
    (``Plan.now``: pass it to the writes).
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
    encode_many = encode_many or (lambda values: [encode(v) for v in values])
    expiring = expiring or {}
    groups: list[Group] = []
    gated: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    objects: set[int] = {id(root)}
    queues: set[str] = set()  # validated once per queue
    names: set[str] = set()  # and once per job name
    settings: set[tuple] = {_DEFAULTS}  # and once per set of failure flags and settings
    dedups: set[tuple[str, str]] = set()  # (queue, dedup key): one leaf per key in a flow
    deps: list = []  # (queue, id, children list, depends_on, depth) of nodes with depends_on
    prefix, serial = prefix or id_prefix(), 0  # generated ids: the prefix, then serial in hex
    now = int(time.time() * 1000) if now is None else int(now)
    token = incarnation(now)
    # a level: (parent queue, parent id, the parent's children list, its Flow children)
    level: list[tuple[str, str, list | None, list]] = [("", "", None, [root])]
    depth = 0
    # The loop runs once per node of flows of 10,000+: it avoids calls it can
    # (docs/explanation/performance.md#the-adds-python): a fan-out of plain
    # leaves is planned whole; otherwise no object per node, the common
    # defaults tested inline, each distinct name and setting checked once.
    while level:
        next_level = []
        for pq, pid, kids, flows in level:
            fan_out = _plain_leaves(flows, objects) if kids is not None else None
            # the common fan-out: one run, checked as a whole
            if fan_out is not None and fan_out[0] not in expiring:
                queue, name, members = fan_out
                n = len(flows)
                ids = list(map(prefix.__add__, map("%x".__mod__, range(serial, serial + n))))
                serial += n
                if queue not in queues:
                    queues.add(validate_queue(queue))
                if name not in names:
                    names.add(_node_name(name, queue, ids[0]))
                payloads = encode_many(list(map(_payload, flows)))
                objects |= members
                kids.extend(zip(repeat(queue), ids))
                groups.append(
                    Group(
                        queue,
                        depth,
                        name,
                        pid,
                        pq,
                        _FP,
                        "",
                        "",
                        False,
                        "",
                        "",
                        token if pq != queue else "",
                        ids,
                        payloads,
                        [_LEAF] * n,
                    )
                )
                continue
            group, group_key = None, None  # a new group per parent
            for flow in flows:
                if type(flow) is not Flow and not isinstance(flow, Flow):
                    raise FlowError(
                        f"a flow's children must be Flow objects, got {type(flow).__name__}"
                    )
                if kids is not None:  # the root is in objects already
                    if id(flow) in objects:
                        node = f"{flow.queue}/{flow.job_id or '(no id)'} ({flow.name})"
                        raise FlowError(
                            f"flow node {node} appears twice (a cycle, or one node under "
                            "two parents); a flow is a tree"
                        )
                    objects.add(id(flow))
                queue, job_id, name, children, payload = _core(flow)
                waits_for = flow.depends_on
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
                    job_id = f"{prefix}{serial:x}"
                    serial += 1
                if name not in names:  # validated once per name: flows share a few
                    names.add(_node_name(name, queue, job_id))
                if type(children) is not list and not isinstance(children, list | tuple):
                    raise FlowError(
                        f"children of {queue}/{job_id} must be a list of Flow, "
                        f"got {type(children).__name__}"
                    )
                sig = _settings(flow)
                if sig == _PLAIN and queue not in expiring:  # the common node: no options
                    ma = bo = None
                    cont = ignore = remove = False
                    opts = ""
                else:
                    fail, ignore, remove, cont, ma, bo = sig[:6]
                    bools = all(type(f) is bool for f in sig[:4])  # True == 1, 2.0 == 2: types too
                    what = (fail, ignore, remove, cont, bools, ma, type(ma), bo, type(bo))
                    if what not in settings:
                        check_node_settings(flow, queue, job_id)
                        settings.add(what)
                    priority, delay, timeout, dedup, dedup_ttl, children_timeout, keep = sig[6:13]
                    opts = (
                        ""
                        if not (
                            priority
                            or delay
                            or timeout is not None
                            or dedup is not None
                            or dedup_ttl is not None
                            or children_timeout is not None
                            or keep is not None
                            or sig[13:] != _NO_RETRY  # docs/howto/retries.md
                            or queue in expiring
                        )
                        else node_options(
                            flow,
                            f"{queue}/{job_id}",
                            bool(children or waits_for),
                            dedups,
                            expiring.get(queue),
                        )
                    )
                payload = encode(payload)
                if kids is None:
                    policy = _FP
                else:
                    policy = _CP if cont else _ID if ignore else _RD if remove else _FP
                    kids.append((queue, job_id))
                mine: list | tuple = [] if children or waits_for else _LEAF
                inc = token if children or waits_for else ""
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
                if waits_for:
                    deps.append((queue, job_id, mine, waits_for, depth + 1))
        level = next_level
        depth += 1
    if not deps:
        return Plan(groups, gated, now=now)
    return Plan(groups, gated, dependencies(deps, groups, gated, token), now)


def _plain_leaves(flows: list, objects: set) -> tuple[str, str, set[int]] | None:
    """``(queue, name, ids of the nodes)`` when ``flows`` are two or more
    leaves of one queue and one job name, with generated ids, no settings
    and no options, none met before in the flow (``objects``); else None
    (``plan()`` then checks them one by one, and raises what it finds).
    Tested in C calls: the first node's attributes against the defaults,
    then every node's fields against the first's, payload aside."""
    n = len(flows)
    if n < 2 or set(map(type, flows)) != {Flow}:
        return None
    first = _shape(flows[0])
    if first[1] is not None or first[3] != [] or first[4] != [] or first[5:] != _PLAIN:
        return None
    if vars(flows[0]).keys() != _FIELDS:  # the first: the fields as __init__ sets them
        return None
    # the others' fields but payload (more are ignored), not through vars(): it would leave a
    # __dict__ on each (docs/explanation/performance.md#no-dict-left-on-a-flows-nodes)
    try:
        if not all(map(_BUT_PAYLOAD(flows[0]).__eq__, map(_BUT_PAYLOAD, flows))):
            return None
    except AttributeError:  # a field deleted from a node: plan() checks them one by one
        return None
    ids = set(map(id, flows))
    if len(ids) != n or not objects.isdisjoint(ids):
        return None
    return first[0], first[2], ids


def _node_name(name, queue: str, job_id: str) -> str:
    """``name`` when it is a valid job name; ``FlowError`` naming the node
    ``queue/job_id`` and the rule otherwise."""
    if type(name) is not str or not name:
        raise FlowError(f"flow node {queue}/{job_id} needs a job name (the handler)")
    try:
        return validate_name(name)
    except ValueError as err:
        raise FlowError(f"flow node {queue}/{job_id}: {err}") from None
