"""Signatures, chains, groups and chords, and how each compiles to one flow
(docs/explanation/canvas.md).

A canvas is a description: nothing touches Redis until ``enqueue()``, which
compiles it to one ``Flow`` and lands it with ``add_flow`` (one atomic script
on one queue, parent first across queues; no new guarantee). The compile
turns "runs after" into "is the parent of":

* a signature is one flow node (a leaf until something waits on it);
* ``chain(a, b, c)``: ``c`` is the root, ``b`` its only child, ``a`` ``b``'s;
* ``chord(group(a, b), cb)``: ``cb`` is the parent of ``a`` and ``b``, in
  that order;
* a ``group`` on its own (enqueued, or a member of another group) is a
  parent node running the built-in ``echomq_django.group`` handler, which
  returns its members' results as a list.

A flow is a tree, so a link that must wait for several earlier ones at once
(a group or a chord after another link of a chain) cannot be compiled and is
refused with the rule; a group first in a chain is that chain's chord.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from asgiref.sync import sync_to_async

from .. import api
from ..conf.schema import json_encoder
from ..core.exceptions import FlowError, PayloadError
from ..core.flows import Flow
from ..core.jobs import to_json
from ..core.keyspace import validate_queue
from ..core.refs import JobRef
from ..handlers import get_handler, registered

GROUP_JOB = "echomq_django.group"  # the handler of a group's own node (results.py)
_NOT_OPTIONS = {
    "queue",
    "name",
    "payload",
    "children",
    "fail_parent_on_failure",
    "ignore_dependency_on_failure",
    "remove_dependency_on_failure",
    "continue_parent_on_failure",
}
_PLAIN = frozenset({str, int, bool, type(None)})
_QUEUES: set[str] = set()  # queue names task() found valid
OPTIONS = frozenset(f.name for f in fields(Flow)) - _NOT_OPTIONS | {"allow_failure"}


class Canvas:
    """What every canvas shape shares: ``flow()`` compiles it, ``enqueue()``
    / ``aenqueue()`` land it (docs/howto/canvas.md)."""

    __slots__ = ()

    def _parts(self) -> tuple[list[Flow], Flow | None]:
        """``(heads, entry)``: the nodes whatever comes next waits for, and
        the node that waits for whatever came before (None: this shape
        cannot wait for anything). Fresh ``Flow`` objects at every call."""
        raise NotImplementedError

    def flow(self) -> Flow:
        """This canvas as one new ``Flow`` (its root: the last link of a
        chain, a chord's callback, a group's own node). Raises
        ``FlowError`` for a shape a tree cannot hold. Writes nothing."""
        return self._parts()[0][0]

    def enqueue(self, *, mq=None, on_commit: bool | None = None, using: str | None = None):
        """Compile and land this canvas as one flow; returns the root's
        ``JobRef`` (``emq.wait(ref)`` blocks for its result). ``mq``: an
        ``EchoMQ`` to land it with (then ``on_commit`` / ``using`` do not
        apply); default the module API's ``add_flow`` with its ``on_commit``
        and ``using``. Raises what ``add_flow`` raises (``FlowError``,
        ``PayloadError``, ``FlowConflict``, ``RedisUnavailable``), all before
        any write when the canvas is malformed.
        docs/howto/canvas.md#enqueue-and-wait"""
        flow = self.flow()
        if mq is not None:
            if on_commit is not None or using is not None:
                raise TypeError("enqueue(mq=...) lands now: on_commit and using do not apply")
            return mq.add_flow(flow).ref
        return api.add_flow(flow, on_commit=on_commit, using=using).ref

    async def aenqueue(self, **kwargs: Any) -> JobRef:
        """``enqueue`` for async code, in the thread Django's async ORM uses
        (as ``emq.aenqueue``). Same arguments and errors."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(**kwargs)


@dataclass(slots=True)
class Signature(Canvas):
    """One job to run: a registered handler's name, its queue, its payload
    (a dict of JSON values) and flow-node options (``Flow``'s fields:
    ``job_id``, ``priority``, ``delay_ms`` (ms), ``timeout_ms`` (ms),
    ``max_attempts``, ``backoff_ms`` (ms), ``keep`` (s), ...), plus
    ``allow_failure``: its death does not stop what waits for it (the
    ``ignore_dependency_on_failure`` policy). Build it with ``task()``.
    docs/howto/canvas.md#signatures"""

    name: str
    queue: str
    payload: dict = field(default_factory=dict)
    options: dict | None = None  # None: none (a signature without options allocates no dict)

    def set(self, **options: Any) -> Signature:
        """A copy with ``options`` added (see the class). Raises
        ``FlowError`` naming an unknown option and the known ones, or an
        ``allow_failure`` that is not True or False."""
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise FlowError(
                f"unknown option(s) {unknown} for signature {self.name!r}; "
                f"a signature takes {sorted(OPTIONS)}"
            )
        if type(options.get("allow_failure", False)) is not bool:  # "no" would be true
            raise FlowError(
                f"allow_failure of signature {self.name!r} must be True or False, "
                f"got {options['allow_failure']!r}"
            )
        return replace(self, options={**(self.options or {}), **options})

    def _parts(self) -> tuple[list[Flow], Flow | None]:
        if not self.options:  # the usual signature: no copy, no options to apply
            node = Flow(self.queue, self.name, self.payload)
            return [node], node
        opts = dict(self.options)
        allow = opts.pop("allow_failure", False)
        node = Flow(self.queue, self.name, self.payload, ignore_dependency_on_failure=allow, **opts)
        return [node], node


def _handler_name(handler: Any) -> str:
    """A job name given as itself or as the function ``@handler`` registered.
    Raises ``FlowError``: unknown name (close names suggested), or a function
    no ``@handler`` registered."""
    if callable(handler) and not isinstance(handler, str):
        for name in registered():
            h = get_handler(name)
            if h is handler or getattr(h, "__wrapped__", None) is handler:
                return name
        raise FlowError(f"{handler!r} is not registered with @handler: a signature names a handler")
    if not isinstance(handler, str) or get_handler(handler) is None:
        known = registered()
        close = difflib.get_close_matches(str(handler), known, n=3)
        hint = f"did you mean {close}? " if close else ""
        raise FlowError(
            f"no handler is registered for job name {handler!r}: {hint}a signature names "
            f"a registered @handler (known: {known})"
        )
    return handler


def _check_json(name: str, payload: dict) -> None:
    """Raise ``PayloadError`` naming the first argument of ``payload`` that
    neither plain JSON nor the configured encoder (``JSON_ENCODER``, asked
    only then: a subclass writes plain JSON values as plain JSON does) can
    write."""
    for value in payload.values():  # str, int, bool, None: JSON as they are, no encoding
        if type(value) not in _PLAIN:
            break
    else:
        return
    try:
        to_json(payload)
        return
    except (TypeError, ValueError, RecursionError):
        pass
    encoder = json_encoder()
    encode = to_json if encoder is None else encoder(allow_nan=False).encode
    try:
        encode(payload)
        return
    except (TypeError, ValueError, RecursionError):
        pass
    for key, value in payload.items():
        try:
            encode(value)
        except (TypeError, ValueError, RecursionError) as err:
            raise PayloadError(
                f"argument {key}={value!r} of task {name!r} is not JSON-serialisable "
                f"({err}): a payload is JSON"
            ) from None
    raise PayloadError(f"the payload of task {name!r} is not JSON-serialisable: a payload is JSON")


def task(handler: Any, *, queue: str, **payload: Any) -> Signature:
    """A ``Signature``: run ``handler`` (a registered job name, or the
    function ``@handler`` registered) on ``queue`` with ``payload`` (keyword
    arguments: the job's ``payload`` dict). Checked now, nothing written:
    raises ``FlowError`` for an unknown handler (the close registered names
    suggested), ``ValueError`` for a bad queue name, ``PayloadError`` naming
    an argument that is not JSON. docs/howto/canvas.md#signatures"""
    name = handler if type(handler) is str and get_handler(handler) else _handler_name(handler)
    if queue not in _QUEUES:  # checked once per name; a bounded memo
        validate_queue(queue)
        if len(_QUEUES) < 1024:
            _QUEUES.add(queue)
    _check_json(name, payload)
    return Signature(name, queue, payload)


def _canvas(value: Any, where: str) -> Canvas:
    if not isinstance(value, Canvas):
        raise FlowError(
            f"{where} takes signatures, chains, groups or chords, got {type(value).__name__}"
        )
    return value


class Chain(Canvas):
    """Links run one after the other, each one's handler reading the one
    before's result (``previous_result(job)``); a dead link stops the
    chain (its policy: the next link dies ``failed by child``) unless it
    allows failure. docs/howto/canvas.md#chain"""

    def __init__(self, *links: Canvas) -> None:
        if len(links) == 1 and isinstance(links[0], list | tuple):
            links = tuple(links[0])
        if len(links) < 2:
            raise FlowError(
                f"a chain needs at least two links, got {len(links)}: "
                "enqueue a lone signature itself"
            )
        self.links = [_canvas(link, "chain") for link in links]

    def _parts(self) -> tuple[list[Flow], Flow | None]:
        first = self.links[0]
        # a group first in a chain is that chain's chord: its members, no node of its own
        heads, entry = (first._heads(), None) if isinstance(first, Group) else first._parts()
        for n, link in enumerate(self.links[1:], 2):
            if isinstance(link, Group):
                raise FlowError(
                    f"link {n} of a chain is a group: each of its members would wait for "
                    "the link before, and a flow is a tree; put the group first, or make "
                    "the link before a step job that adds the group's jobs as its children "
                    "(docs/howto/step-jobs.md)"
                )
            link_heads, link_entry = link._parts()
            if link_entry is None:
                raise FlowError(
                    f"link {n} of a chain is a chord: its group would wait for the link "
                    "before, and a flow is a tree; put the chord first"
                )
            link_entry.children = heads
            heads = link_heads
        return heads, entry


class Group(Canvas):
    """Members that run in parallel (any queues). Enqueued alone or as a
    member of a group, it is a node of its own (the ``echomq_django.group``
    handler, on ``queue``: default the first member's) whose result is the
    members' results as a list, in order. First in a chain or a chord's
    header, its members are the next link's children directly.
    docs/howto/canvas.md#group"""

    def __init__(self, *members: Canvas, queue: str | None = None) -> None:
        if len(members) == 1 and isinstance(members[0], list | tuple):
            members = tuple(members[0])
        if not members:
            raise FlowError("a group needs at least one member, got none")
        self.members = [_canvas(m, "group") for m in members]
        self.queue = validate_queue(queue) if queue is not None else None

    def _heads(self) -> list[Flow]:
        # a member that is a plain signature (the usual chord) becomes its node
        # at once: no (heads, entry) pair per member
        return [
            Flow(m.queue, m.name, m.payload) if type(m) is Signature and not m.options else m.flow()
            for m in self.members
        ]

    def _parts(self) -> tuple[list[Flow], Flow | None]:
        heads = self._heads()
        return [Flow(self.queue or heads[0].queue, GROUP_JOB, {}, children=heads)], None


class Chord(Canvas):
    """A group, then ``callback`` once every member resolved: the
    callback's handler reads the members' results in the group's order
    (``group_results(job)``). A dead member kills the callback (``failed by
    child``) unless it allows failure (then its place holds ``None``).
    docs/howto/canvas.md#chord"""

    def __init__(self, header: Any, callback: Canvas) -> None:
        if isinstance(header, list | tuple):
            header = Group(*header) if header else None
        if header is None or (isinstance(header, Group) and not header.members):
            raise FlowError("a chord needs a group of at least one member, got an empty group")
        if not isinstance(header, Group):
            raise FlowError(f"a chord's header is a group, got {type(header).__name__}")
        self.header = header
        self.callback = _canvas(callback, "chord")

    def _parts(self) -> tuple[list[Flow], Flow | None]:
        if isinstance(self.callback, Group):
            raise FlowError("a chord's callback is a group: make it a signature or a chain")
        heads, entry = self.callback._parts()
        if entry is None:
            raise FlowError("a chord's callback is a chord: its group would wait for this one")
        entry.children = self.header._heads()
        return heads, None


def chain(*links: Canvas) -> Chain:
    """``Chain(*links)``: at least two (or one list of them)."""
    return Chain(*links)


def group(*members: Canvas, queue: str | None = None) -> Group:
    """``Group(*members, queue=...)``: at least one (or one list of them)."""
    return Group(*members, queue=queue)


def chord(header: Any, callback: Canvas) -> Chord:
    """``Chord(header, callback)``: ``header`` a group or a list of at least
    one canvas."""
    return Chord(header, callback)
