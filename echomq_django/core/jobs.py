"""The data shapes: a job, its state enum, what a transition did, a parent's
dependencies, the queue defaults, and the encoding to and from Redis.

A job row is the hash ``P:{q}:job:<id>`` (docs/explanation/protocol.md#keys). Encoding and decoding
live here and nowhere else. Of the package it imports only
``core/refs.py`` (a job named by ``JobRef``), ``core/live.py`` (what a
running job reports) and ``core/rows.py`` (the row's field names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from .live import KEEP_LOGS, Reporting
from .refs import JobRef
from .rows import (
    CREATED,
    NAME,
    PARENT,
    PARENT_INC,
    PARENT_QUEUE,
    PAYLOAD,
    PENDING,
    POLICY,
    STATE,
    created_of,
    parent_link,
    row_get,
    to_text,
)

# A queue's settings when ECHOMQ["QUEUES"] gives none
# (docs/explanation/protocol.md#leases-and-recovery).
QUEUE_DEFAULTS = {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 1000, "LEASE_MS": 30000, "KEEP_LOGS": KEEP_LOGS}
MAX_PAYLOAD_BYTES = 512 * 1024  # bytes of JSON per payload or result, by default
# the longest lease (ms): 365 days. A deadline (now + lease) stays an exact integer score,
# where 2**63 ms came back negative and held its job for ever
# (docs/explanation/protocol.md#leases-and-recovery)
MAX_LEASE_MS = 365 * 24 * 3600 * 1000

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# The C encoder behind _ENCODER, built once: JSONEncoder.encode() builds a new
# one per call, which costs more than encoding a small payload (docs/explanation/performance.md).
_C_ENCODE = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None,
    _ENCODER.default,
    json.encoder.encode_basestring_ascii,
    None,
    ":",
    ",",
    False,
    False,
    False,
)


# the exact types _C_ENCODE takes whole, as _ENCODER writes them (a subclass, a tuple or
# an object for `default` goes through _ENCODER)
_C_KINDS = frozenset((dict, list, str, int, float, bool, type(None)))


def to_json(value: Any) -> str:
    """``value`` as compact ASCII JSON text (no NaN), one byte per character.
    Raises ``TypeError`` / ``ValueError`` as ``json`` does, and
    ``RecursionError`` for a circular or too deeply nested value (the C
    encoder has no circular check); ``EchoMQ.encode`` turns these into
    ``PayloadError`` and applies the size limit."""
    if type(value) in _C_KINDS and _C_ENCODE is not None:  # the usual payloads and results
        return "".join(_C_ENCODE(value, 0))
    return _ENCODER.encode(value)


def to_json_many(values: list) -> list[str]:
    """``to_json`` of each of ``values``, in order, no Python frame per dict or list
    (docs/explanation/performance.md#the-adds-python). Raises as ``to_json``."""
    if _C_ENCODE is None:
        return list(map(to_json, values))
    join, encode = "".join, _C_ENCODE
    return [join(encode(v, 0)) if type(v) in _C_KINDS else to_json(v) for v in values]


class JobState(StrEnum):
    """The job states (docs/explanation/protocol.md#job-states): a job row's ``state`` field."""

    #: in the queue's ``pending`` list, ready to be claimed
    PENDING = "pending"
    #: claimed: a worker holds its lease (``active`` zset, by lease deadline)
    ACTIVE = "active"
    #: waiting for a time: backoff after a failure, or ``delay_ms``
    DELAYED = "delayed"
    #: finished with a result (kept in ``completed``)
    COMPLETED = "completed"
    #: failed for good (attempts spent, ``Unrecoverable``, or its children failed it)
    DEAD = "dead"
    #: a parent whose children have not all resolved yet
    AWAITING_CHILDREN = "awaiting_children"


class Policy(StrEnum):
    """What a child's death does to its parent
    (docs/explanation/protocol.md#policies), as stored on the
    child's row (``parent_policy``) and in outbox entries (``pol``). A row
    stores it only when it is not ``FAIL_PARENT``."""

    #: the parent dies too (``fail_parent_on_failure``, the default)
    FAIL_PARENT = "fp"
    #: recorded in the parent's ``:unsuccessful``; the parent goes on
    #: (``ignore_dependency_on_failure``)
    IGNORE = "id"
    #: unlinked: recorded in the parent's ``:removed``
    #: (``remove_dependency_on_failure``)
    REMOVE = "rd"
    #: recorded in the parent's ``:unsuccessful`` like IGNORE, and the parent
    #: is released at once (``continue_parent_on_failure``, docs/explanation/protocol.md#policies)
    CONTINUE_PARENT = "cp"


def row_error(r: dict) -> str | None:
    """A job row's ``error`` joined from its pieces: ``r`` maps field names
    (str) to raw values (bytes or str, absent or None when the row has none);
    a long error is kept as ``error``, ``error.2`` ... ``error.<n>`` with
    ``error.n`` = n (lua/lib/error.lua: a row of short values stays a compact
    listpack). Returns the text, or None when the row holds no error."""
    first, n = r.get("error"), r.get("error.n")
    if first is None or n is None:
        return to_text(first)
    parts = [first, *(r.get(f"error.{i}") for i in range(2, int(n) + 1))]
    return "".join(to_text(p) or "" for p in parts)


def decode_policy(value: Any, has_parent: bool) -> Policy | None:
    """A row's ``parent_policy`` field (raw, or None when the row has none) as
    a ``Policy``: the compact row leaves out ``fp``, so a child without the
    field is ``FAIL_PARENT``; a job with no parent has none."""
    if value:
        return Policy(to_text(value))
    return _FAIL_PARENT if has_parent else None


_FAIL_PARENT = Policy.FAIL_PARENT  # a module global: an Enum member lookup costs ~0.3 us


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _defaults(mq: JobSource | None, queue: str) -> tuple[int, int]:
    """The queue's (max_attempts, backoff_ms) for a row that has none."""
    if mq is None:
        return QUEUE_DEFAULTS["MAX_ATTEMPTS"], QUEUE_DEFAULTS["BACKOFF_MS"]
    return mq.setting(queue, "MAX_ATTEMPTS"), mq.setting(queue, "BACKOFF_MS")


def _compact(queue: str, mq, parent, parent_queue, policy, max_attempts, backoff_ms) -> tuple:
    """The compact row's defaults, decoded in this one place (a row stores a
    field only when it differs from its default): no ``max_attempts`` /
    ``backoff_ms``: the queue's settings (``mq``'s, else ``QUEUE_DEFAULTS``);
    no ``parent_queue``: the job's own queue; no ``parent_policy``:
    ``Policy.FAIL_PARENT``. Takes the raw values (None: not in the row);
    returns ``(parent, parent_queue, parent_policy, max_attempts,
    backoff_ms)`` decoded."""
    parent = to_text(parent)
    max_attempts = int(max_attempts) if max_attempts else 0
    if not max_attempts or backoff_ms is None:
        default_attempts, default_backoff = _defaults(mq, queue)
        max_attempts = max_attempts or default_attempts
        if backoff_ms is None:
            backoff_ms = default_backoff
    return (
        parent,
        to_text(parent_queue) or (queue if parent else None),
        Policy(to_text(policy)) if policy else (_FAIL_PARENT if parent else None),
        max_attempts,
        int(backoff_ms),
    )


def _json(value: Any) -> Any:
    return None if value is None else json.loads(value)


@dataclass
class Dependencies:
    """A parent's children by how they resolved (docs/explanation/protocol.md#a-parents-keys).

    Each child is a ``JobRef`` (docs/howto/read-flows.md#job-references): ``processed``
    maps child -> result; ``failed`` and ``ignored`` map child -> error
    (``fp`` and ``id`` deaths); ``removed`` maps child -> error (``rd``
    deaths); ``unprocessed`` lists the children not resolved yet, sorted;
    ``remaining`` is the ``:dependencies`` counter. The maps are ``RefDict``
    and ``unprocessed`` a ``RefList``: a raw key still finds its child for a
    release, with a ``DeprecationWarning`` (docs/howto/read-flows.md#deprecated-raw-keys).
    """

    processed: dict[JobRef, Any] = field(default_factory=dict)
    unprocessed: list[JobRef] = field(default_factory=list)
    failed: dict[JobRef, str] = field(default_factory=dict)
    ignored: dict[JobRef, str] = field(default_factory=dict)
    removed: dict[JobRef, str] = field(default_factory=dict)
    remaining: int = 0


class JobSource(Protocol):
    """What a ``Job`` asks of the ``EchoMQ`` that read it (its lazy parent
    reads and its queue's defaults). ``EchoMQ`` satisfies it; typing ``Job``
    against it keeps this module below the protocol (cf. huey's BaseStorage)."""

    keys: Any  # a keyspace.Keyspace
    progress: Any  # protocol/live/progress.Progress: what a running job reports

    def setting(self, queue: str, name: str) -> int: ...
    def children_values(self, queue: str, job_id: str, cursor: int = 0, count=None) -> Any: ...
    def dependencies(self, queue: str, job_id: str, cursor: int = 0, count=None) -> Any: ...
    def ignored_failures(self, queue: str, job_id: str, cursor: int = 0, count=None) -> Any: ...


@dataclass
class Job(Reporting):
    """One job as read from Redis; a handler reports through it (``Reporting``).

    ``payload`` and ``result`` are decoded JSON; timestamps are ms since the
    epoch; ``lease`` is the token a worker holds (set by ``claim`` only);
    ``parent`` / ``parent_queue`` / ``parent_policy`` (a ``Policy``) are set
    on a flow child (docs/explanation/glossary.md#flows; a row stores the parent queue only when it
    differs and the policy only when it is not ``fp``: ``decode``). ``children_values()``,
    ``dependencies()`` and ``ignored_failures()`` read Redis lazily, on first
    use only, and cache the answer.
    """

    id: str
    queue: str
    name: str
    payload: Any = None
    state: JobState = JobState.PENDING
    attempts: int = 0
    max_attempts: int = 1
    backoff_ms: int = 0
    result: Any = None
    error: str | None = None
    parent: str | None = None
    parent_queue: str | None = None
    parent_policy: Policy | None = None
    created_at: int | None = None
    started_at: int | None = None  # the last attempt's start (ms)
    first_started_at: int | None = None  # the first attempt's start (ms)
    finished_at: int | None = None
    stalls: int = 0
    lease: str | None = None
    lease_deadline: int | None = None
    priority: int = 0
    timeout_ms: int | None = None  # its own limit per attempt (ms); None: the queue's
    progress: Any = None  # the last report_progress value (core/live.py), decoded JSON
    traceparent: str | None = None  # W3C trace context of its add (docs/howto/tracing.md)
    # its own retry policy, the row's `retry_policy` field (core/retry.py); None: the queue's
    retry_policy: str | None = field(default=None, repr=False)
    timed_out: bool = field(default=False, compare=False)  # set by the worker
    # cancelled while it runs (docs/explanation/lifecycle.md): set when the row carries the mark,
    # or when the worker's heartbeat learns it; the handler may read it and stop
    cancelled: bool = field(default=False, compare=False)
    _mq: JobSource | None = field(default=None, repr=False, compare=False)
    # where a running job's progress and log writes go (core/live.py ``Reporting``): set by
    # the worker that runs it (runners/flusher.py); None: each write is sent at once
    _writes: Any = field(default=None, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)
    # this run's add_children calls (docs/explanation/protocol.md#step-jobs): [the row's
    # `waits`, read at the first call, calls made]; None before the first
    _adds: list | None = field(default=None, repr=False, compare=False)

    @classmethod
    def decode(
        cls,
        queue: str,
        job_id: str,
        r: dict[str, Any],
        mq: JobSource | None = None,
        state: JobState | None = None,
        lease_deadline: int | None = None,
    ) -> Job:
        """Decode a job row. ``r`` maps field names to raw
        values (bytes or str; a field the row does not hold is absent or
        None); ``state`` overrides the row's. The compact row's defaults come
        from ``_compact``; a row without a state is pending (a job added as
        pending holds none: docs/explanation/protocol.md#the-job-row).
        Raises ``ValueError`` for a state it does not know."""
        parent, parent_queue, policy, max_attempts, backoff_ms = _compact(
            queue,
            mq,
            *parent_link(job_id, row_get(r, PARENT), row_get(r, PARENT_QUEUE)),
            row_get(r, POLICY),
            r.get("max_attempts"),
            r.get("backoff_ms"),
        )
        return cls(
            id=job_id,
            queue=queue,
            name=to_text(row_get(r, NAME)) or "",
            payload=_json(row_get(r, PAYLOAD)),
            state=state or JobState(to_text(row_get(r, STATE)) or PENDING),
            attempts=_int(r.get("attempts")) or 0,
            max_attempts=max_attempts,
            backoff_ms=backoff_ms,
            result=_json(r.get("result")),
            error=mq.keys.unkey(row_error(r)) if mq is not None else row_error(r),
            parent=parent,
            parent_queue=parent_queue,
            parent_policy=policy,
            created_at=_int(created_of(row_get(r, CREATED), row_get(r, PARENT_INC))),
            started_at=_int(r.get("started_at")),
            first_started_at=_int(r.get("first_started_at") or r.get("started_at")),
            finished_at=_int(r.get("finished_at")),
            stalls=_int(r.get("stalls")) or 0,
            lease=to_text(r.get("lease")),
            lease_deadline=lease_deadline,
            priority=_int(r.get("priority")) or 0,
            timeout_ms=_int(r.get("timeout_ms")),
            progress=_json(r.get("progress")),
            traceparent=to_text(r.get("traceparent")),
            retry_policy=to_text(r.get("retry_policy")),
            _mq=mq,
            cancelled=r.get("cancel") is not None,
        )

    @classmethod
    def from_row(cls, queue: str, job_id: str, row: dict, mq: JobSource | None = None) -> Job:
        """Build a Job from an HGETALL reply (bytes or str keys and values)."""
        return cls.decode(queue, job_id, {to_text(k): v for k, v in row.items()}, mq)

    @property
    def ref(self) -> JobRef:
        """The job as a ``JobRef`` (docs/howto/read-flows.md#job-references)."""
        return JobRef(self.queue, self.id)

    @property
    def parent_ref(self) -> JobRef | None:
        """The parent as a ``JobRef``, or None for a job without one."""
        return JobRef(self.parent_queue, self.parent) if self.parent else None

    def _require_mq(self) -> JobSource:
        if self._mq is None:
            raise RuntimeError("this Job is not bound to an EchoMQ; read it with get_job()")
        return self._mq

    def _lazy(self, name: str, cursor: int, count: int | None):
        if count is not None:  # a page: read each time, never cached
            return getattr(self._require_mq(), name)(self.queue, self.id, cursor, count)
        if name not in self._cache:
            self._cache[name] = getattr(self._require_mq(), name)(self.queue, self.id)
        return self._cache[name]

    def children_values(self, cursor: int = 0, count: int | None = None):
        """``{JobRef: result}`` of the processed children (one read, cached);
        with ``count``, one ``Page`` of them (docs/howto/read-flows.md#paged-reads). See
        ``EchoMQ.children_values``."""
        return self._lazy("children_values", cursor, count)

    def dependencies(self, cursor: int = 0, count: int | None = None):
        """The parent's ``Dependencies`` (one read, cached); with ``count``,
        one ``Page`` of them. See ``EchoMQ.dependencies``."""
        return self._lazy("dependencies", cursor, count)

    def ignored_failures(self, cursor: int = 0, count: int | None = None):
        """``{JobRef: error}`` of ignored dead children (one read, cached);
        with ``count``, one ``Page`` of them. See ``EchoMQ.ignored_failures``."""
        return self._lazy("ignored_failures", cursor, count)


@dataclass
class Outcome:
    """What one transition did, decoded from a script's JSON reply.

    ``state`` is the job's new state; ``run_at`` (ms) is set when it went to
    delayed; the lists hold ``JobRef`` values (``(queue, id)`` pairs) of jobs the same script also
    moved: parents released, jobs that went dead (this one included when it
    died), parents that went dead because of a child (``flow_failed``), parents
    revived to awaiting_children by a retry, jobs retried.
    """

    state: JobState | None = None
    run_at: int | None = None
    released: list[JobRef] = field(default_factory=list)
    dead: list[JobRef] = field(default_factory=list)
    flow_failed: list[JobRef] = field(default_factory=list)
    revived: list[JobRef] = field(default_factory=list)
    retried: list[JobRef] = field(default_factory=list)
    recovered: int = 0
    outbox: int = 0
    # the outbox entries (texts) the script pushed for other slots, as pushed (a reply's
    # `sent`): its worker delivers them
    # (docs/explanation/no-polling.md#a-released-parent-starts-at-once)
    sent: list[str] = field(default_factory=list)

    @classmethod
    def from_reply(cls, reply: Any, parse) -> Outcome:
        """Decode a script's ``cjson.encode(OUT)`` reply; ``parse`` maps a
        ``P:{q}:<id>`` string to its ``JobRef``."""
        return cls.from_data(json.loads(reply), parse)

    @classmethod
    def from_data(cls, data: dict, parse, state: JobState | None = None) -> Outcome:
        """Decode one decoded reply object (a script's ``OUT``, or one job's
        entry of ``complete``'s reply); ``state`` stands in when it has none."""

        def pairs(name: str) -> list[tuple[str, str]]:
            return [parse(v) for v in data.get(name) or []]

        new = data.get("state")
        return cls(
            state=JobState(new) if new else state,
            run_at=data.get("run_at"),
            released=pairs("released"),
            dead=pairs("dead"),
            flow_failed=pairs("flow_failed"),
            revived=pairs("revived"),
            retried=pairs("retried"),
            recovered=data.get("recovered") or 0,
            outbox=data.get("outbox") or 0,
            sent=data.get("sent") or [],  # (an empty Lua table encodes as {})
        )

    def merge(self, other: Outcome) -> None:
        """Add ``other``'s lists and counts to this one (state stays)."""
        for name in ("released", "dead", "flow_failed", "revived", "retried"):
            getattr(self, name).extend(getattr(other, name))
        self.recovered += other.recovered
        self.outbox += other.outbox
        self.sent.extend(other.sent)
