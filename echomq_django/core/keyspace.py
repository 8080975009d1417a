"""Every Redis key echomq_django uses (the rules for the names inside them: core/names.py).

This is the only module that knows the prefix and spells a key name
(docs/explanation/protocol.md#keys); the tables below are the table of contents of the
keyspace (cf. BullMQ's ``queue_keys.py``). Every key of queue ``q`` is
``P:{q}:...``; the ``{q}`` hash tag pins a queue to one Redis Cluster slot,
so all of a queue's keys can be used by one Lua script. The Lua scripts build
the same names from the ``P:{q}:`` base they get as ARGV;
``tests/test_keyspace.py`` checks that every suffix a script spells is listed
here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from .names import (  # noqa: F401 (the rules and checks, imported from here too)
    GROUP_RULE,
    ID_RULE,
    NAME_RULE,
    PREFIX_RULE,
    QUEUE_RULE,
    refused_char,
    validate_group,
    validate_id,
    validate_name,
    validate_prefix,
    validate_queue,
)
from .rows import id_head, serial_ids

QUEUE_KEYS = {
    "pending": "pending",  # list: ids ready to claim, oldest first; an 'id:<hex>' entry a range
    # counter: the ids pending's ranges stand for beyond one entry each; gone with the last range
    "pending_ranged": "pending:ranged",
    "active": "active",  # zset: id -> lease deadline (ms)
    "delayed": "delayed",  # zset: id -> when it is due (ms)
    "awaiting": "awaiting",  # zset: parents waiting on children, by time
    "completed": "completed",  # zset: id -> finished_at (ms)
    "dead": "dead",  # zset: id -> finished_at (ms)
    # stream: e (event), id (retention's `removed`: a block's ids, space-separated);
    # capped near 10,000 entries (lua/lib/emit.lua)
    "events": "events",
    "outbox": "flow:outbox",  # list: cross-queue fan-in entries for the pump
    # list: outbox entries the pump gave up on, newest last; the newest 1,000
    # kept (protocol/outbox.OUTBOX_DEADLETTER_MAX, trimmed by trim_outbox as it pushes)
    "deadletter": "flow:deadletter",
    "outbox_tries": "flow:tries",  # hash: outbox entry -> failed deliveries
    "pump_lock": "pump:lock",  # string: the sweep lock of this queue's outbox
    # list: a mark left by each drop of pump:lock (one at most, 1 s TTL), for
    # the callers waiting for the lock to block on (lua/lock_outbox.lua)
    "pump_unlocked": "pump:unlocked",
    "lease_seq": "lease:seq",  # counter: lease tokens
    "deadlines": "deadlines",  # zset: parents with a children deadline
    "wake": "wake",  # zset: wake-up markers for the queue's workers
    "outbox_wake": "flow:wake",  # zset: a wake-up marker for the pump
    "timers_lock": "timers:lock",  # string: one worker's timer sweep of the queue
    "expire": "expire",  # zset: finished jobs -> when retention may drop them (ms)
    "gc": "gc",  # list: removed parents whose child refs wait in gc:<seq>:<id>
    "gc_seq": "gc:seq",  # counter: the gc bins
    "cancel": "cancel",  # list: 'id offset' of subtrees still to cancel
    "signals": "signals",  # stream: durable signal events, removed only by dispatch
    "signal_kinds": "signals:kinds",  # set: the event kinds recorded
    "signal_lock": "signals:lock",  # string: a dispatcher's pass over the queue
    "signal_tries": "signals:tries",  # hash: event id -> sends that raised
    # list: events given up on, newest last; the newest 10,000 kept
    # (events.DEADLETTER_MAX, trimmed by ack_signals as it pushes)
    "signal_deadletter": "signals:deadletter",
    "prioritized": "prioritized",  # zset: claimable ids with a priority
    "pri_seq": "pri:seq",  # counter: FIFO order within a priority
    "paused": "paused",  # string: set while the queue is paused
    "limiter": "limiter",  # hash: the RATE_LIMIT window {start, n}
    # hash: per-minute counts of the last 1,440 minutes, a ring (lua/lib/emit.lua)
    "minutes": "minutes",
    # zset: a sliding RATE_LIMIT's starts, lease token -> ms; at most MAX members
    "limiter_log": "limiter:log",
    "limiter_turn": "limiter:log:turn",  # counter: refused claims' turns, expiring per window
    "concurrency": "concurrency",  # string: the cap set at run time (set_concurrency)
    "full": "full",  # string: set while claim found the cap reached with work waiting
    # hash: periodic entries added at run time, entry -> its spec (JSON); bounded
    # by protocol/control/schedules.MAX_RUNTIME_ENTRIES
    "schedules": "schedules",
    "groups": "groups",  # zset: the ring, group -> turn (docs/explanation/protocol.md#groups)
    "groups_seq": "groups:seq",  # counter: the ring's turns
    "groups_pending": "groups:pending",  # counter: claimable ids in all groups
    "groups_active": "groups:active",  # hash: group -> its jobs active now
    "groups_known": "groups:known",  # set: groups with claimable or active jobs
    "groups_capped": "groups:capped",  # set: groups left out of the ring at their cap
    "groups_limited": "groups:limited",  # zset: groups with a full rate window -> when it opens
    "groups_rate": "groups:rate",  # hash: group -> its rate limit set at run time, 'max:per_ms'
    "groups_paused": "groups:paused",  # set: groups paused (emq.pause_group)
    "groups_concurrency": "groups:concurrency",  # hash: group -> its cap set at run time
    # never written: a Cluster's every script call declares it after its own keys,
    # so Redis refuses the call while the slot migrates (absent_key below)
    "absent": "absent",
}
# Keys that hold one value of a family: the suffix is this prefix + a name.
JOB_PREFIX = "job:"  # hash P:{q}:job:<id>: the job row; also the child ref
CLAIM_PREFIX = "claim:"  # string P:{q}:claim:<token>: a claim's memo, for its replay
SCHEDULE_PREFIX = "schedule:"  # string P:{q}:schedule:<entry>: a periodic entry's mark
DEDUP_PREFIX = "dedup:"  # string P:{q}:dedup:<key>: the id holding a dedup key
OP_PREFIX = "op:"  # string P:{q}:op:<token>: a remove/cancel call's memo, for its replay
GC_PREFIX = "gc:"  # list P:{q}:gc:<seq>:<id>: a removed parent's child refs
# stream P:{q}:done:<id>: a finished job's note to its waiters, made by the
# first waiter, expiring with the longest wait (docs/explanation/protocol.md#waiting-for-a-result)
DONE_PREFIX = "done:"
GROUP_PREFIX = "g:"  # P:{q}:g:<group>:<GROUP_KEYS>: a group's claimable ids, gone with them
GROUP_KEYS = {k: k for k in ("pending", "prioritized", "limiter")} | {"pri_seq": "pri:seq"}
# zset P:{q}:commands:<worker id>: operator commands waiting for a worker whose
# first queue is q, popped by its waker (docs/howto/operate-workers.md#how-it-works)
COMMANDS_PREFIX = "commands:"
# JobKeys field -> the suffix after the row key P:{q}:job:<id> (a parent's keys,
# and the lines any job's handler logs), each removed with the row.
JOB_KEYS = {
    "dependencies": ":dependencies",  # counter: children not resolved yet
    "children": ":children",  # list: child refs
    "processed": ":processed",  # hash: child ref -> result JSON
    "failed": ":failed",  # hash: child ref -> error (policy fp)
    "unsuccessful": ":unsuccessful",  # hash: child ref -> error (policy id)
    "removed": ":removed",  # hash: child ref -> error (policy rd)
    # list: the lines the handler logged, oldest first, the newest KEEP_LOGS kept
    # (lua/append_log.lua; docs/explanation/protocol.md#progress-and-log-lines)
    "logs": ":logs",
    # list: the errors of a job's earlier failed attempts, oldest first, the
    # newest ERRORS_KEPT - 1 kept (lua/fail.lua; the row's `error` is the last)
    "errors": ":errors",
}
# job state -> the QueueKeys field (index) that holds a job in that state
STATE_INDEX = {
    "pending": "pending",
    "active": "active",
    "delayed": "delayed",
    "completed": "completed",
    "dead": "dead",
    "awaiting_children": "awaiting",
}


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue, each named once (``QUEUE_KEYS``)."""

    base: str  # P:{q}:
    pending: str
    pending_ranged: str
    active: str
    delayed: str
    awaiting: str
    completed: str
    dead: str
    events: str
    outbox: str
    deadletter: str
    outbox_tries: str
    pump_lock: str
    pump_unlocked: str
    lease_seq: str
    deadlines: str
    wake: str
    outbox_wake: str
    timers_lock: str
    expire: str
    gc: str
    gc_seq: str
    cancel: str
    signals: str
    signal_kinds: str
    signal_lock: str
    signal_tries: str
    signal_deadletter: str
    prioritized: str
    pri_seq: str
    paused: str
    limiter: str
    minutes: str
    limiter_log: str
    limiter_turn: str
    concurrency: str
    full: str
    schedules: str
    groups: str
    groups_seq: str
    groups_pending: str
    groups_active: str
    groups_known: str
    groups_capped: str
    groups_limited: str
    groups_rate: str
    groups_paused: str
    groups_concurrency: str
    absent: str

    def job(self, job_id: str) -> str:
        """``P:{q}:job:<id>``; raises ``ValueError`` for a bad id."""
        return f"{self.base}{JOB_PREFIX}{validate_id(job_id)}"

    def claim(self, token: str) -> str:
        """``P:{q}:claim:<token>``: the memo ``claim.lua`` keeps for a replay."""
        return f"{self.base}{CLAIM_PREFIX}{token}"

    def dedup(self, key: str) -> str:
        """``P:{q}:dedup:<key>``: which job holds a deduplication key."""
        return f"{self.base}{DEDUP_PREFIX}{key}"

    def done(self, job_id: str) -> str:
        """``P:{q}:done:<id>``: the stream a finished job notes for its waiters."""
        return f"{self.base}{DONE_PREFIX}{validate_id(job_id)}"

    def commands(self, worker_id: str) -> str:
        """``P:{q}:commands:<worker id>``: commands waiting for a worker that
        blocks on this queue's slot (its first queue)."""
        return f"{self.base}{COMMANDS_PREFIX}{worker_id}"

    def schedule(self, entry: str) -> str:
        """``P:{q}:schedule:<entry>``: the last tick a periodic entry fired (ms)."""
        return f"{self.base}{SCHEDULE_PREFIX}{entry}"

    def group(self, group: str, part: str) -> str:
        """``P:{q}:g:<group>:<GROUP_KEYS[part]>``; ``ValueError`` for a bad group."""
        return f"{self.base}{GROUP_PREFIX}{validate_group(group)}:{GROUP_KEYS[part]}"

    def index(self, state: str) -> str:
        """The index key holding jobs in ``state`` (a ``JobState`` or its value)."""
        return getattr(self, STATE_INDEX[state])


def absent_key(key: str) -> str:
    """``P:{q}:absent`` for ``key``, any key ``P:{q}:...`` of queue ``q``: a key no
    one writes, which a Cluster's every script call declares after its own keys.
    While the slot migrates, Redis answers a call that declares a missing key with
    ``TRYAGAIN`` or ``ASK`` (and ``TRYAGAIN`` on the importing master), so no script
    starts there and stops midway on a key already moved; the call is "not now"
    (docs/explanation/reliability.md#a-slot-moved-under-load). Raises
    ``ValueError`` for a key with no ``{q}`` hash tag."""
    return f"{key[: key.index('}') + 1]}:{QUEUE_KEYS['absent']}"


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys of one job, each named once (``JOB_KEYS``)."""

    row: str  # P:{q}:job:<id>
    dependencies: str
    children: str
    processed: str
    failed: str
    unsuccessful: str
    removed: str
    logs: str
    errors: str

    @classmethod
    def of(cls, row: str) -> JobKeys:
        """The keys of the job whose row key (child ref) is ``row``."""
        return cls(row, *(row + suffix for suffix in JOB_KEYS.values()))


assert [f.name for f in fields(QueueKeys)][1:] == list(QUEUE_KEYS)
assert [f.name for f in fields(JobKeys)][1:] == list(JOB_KEYS)

# after the prefix: the queue in its hash tag and the id of a job key
_KEY_TAIL = r":\{([A-Za-z0-9_.-]{1,64})\}:" + JOB_PREFIX + r"([^{}:\s]{1,128})"
_ANY_JOB_KEY = re.compile(r"([A-Za-z0-9_.-]{1,32})" + _KEY_TAIL + r"\Z")

QUEUES_KEPT = 1024  # QueueKeys cached per Keyspace; past it the cache starts over


class Keyspace:
    """Builds the keys of docs/explanation/protocol.md#keys for one prefix (default ``emq``).

    Every method validates the queue name (and job id) before it builds a key,
    raising ``ValueError`` naming the rule.
    """

    def __init__(self, prefix: str = "emq") -> None:
        self.prefix = validate_prefix(prefix)
        self._queues: dict[str, QueueKeys] = {}
        self._failed_by: re.Pattern | None = None

    def queue(self, queue: str) -> QueueKeys:
        """The ``QueueKeys`` of ``queue`` (built once, then cached)."""
        keys = self._queues.get(queue)
        if keys is None:
            base = self.base(queue)
            keys = QueueKeys(base, *(base + suffix for suffix in QUEUE_KEYS.values()))
            if len(self._queues) >= QUEUES_KEPT:
                self._queues.clear()
            self._queues[queue] = keys
        return keys

    def base(self, queue: str) -> str:
        """``P:{q}:``, the prefix of every key of ``queue``; Lua scripts get it
        as ARGV and build keys of the same slot from it."""
        return f"{self.prefix}:{{{validate_queue(queue)}}}:"

    def job(self, queue: str, job_id: str) -> str:
        """``P:{q}:job:<id>``: the job row (hash). It is also the child ref."""
        return self.queue(queue).job(job_id)

    child_ref = job

    def job_keys(self, queue: str, job_id: str) -> JobKeys:
        """The ``JobKeys`` of job ``job_id`` of ``queue``."""
        return JobKeys.of(self.job(queue, job_id))

    def refs(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Child refs of ``(queue, id)`` pairs whose names were validated
        already (flows.plan); each queue is checked once, not per id."""
        bases = {q: self.queue(q).base for q in {q for q, _ in pairs}}
        return [f"{bases[q]}{JOB_PREFIX}{i}" for q, i in pairs]

    def job_part(self, queue: str, job_id: str, part: str) -> str:
        """``P:{q}:job:<id>:<part>`` for part in ``JOB_KEYS`` (dependencies,
        children, processed, failed, unsuccessful, removed, logs, errors); ``ValueError``
        for another part."""
        if part not in JOB_KEYS:
            raise ValueError(f"unknown job key {part!r}: one of {', '.join(JOB_KEYS)}")
        return self.job(queue, job_id) + JOB_KEYS[part]

    def queue_key(self, queue: str, name: str) -> str:
        """``P:{q}:<name>`` for a suffix of ``QUEUE_KEYS`` (pending, active,
        ...); ``ValueError`` for a name not listed there."""
        for field_name, suffix in QUEUE_KEYS.items():
            if suffix == name:
                return getattr(self.queue(queue), field_name)
        raise ValueError(f"unknown queue key {name!r}: name it in keyspace.QUEUE_KEYS")

    def queues(self) -> str:
        """``P:queues``: a set of every queue that has had a job
        (docs/explanation/protocol.md#keys-outside-a-queue).
        Not on any queue's slot: the host adds to it, never a script."""
        return f"{self.prefix}:queues"

    def served(self) -> str:
        """``P:served``: a hash of queue -> the ms time since which no live
        worker may have served it: a worker's last heartbeat on it, or the
        queue's first use (docs/howto/operate.md#echomq_stats). Not on any
        queue's slot: the host writes it, never a script."""
        return f"{self.prefix}:served"

    def processes(self) -> str:
        """``P:processes``: a zset of live worker and pump ids -> the ms time
        their registration expires (docs/explanation/protocol.md#keys-outside-a-queue)."""
        return f"{self.prefix}:processes"

    def process(self, process_id: str) -> str:
        """``P:process:<id>``: one worker's or pump's heartbeat (a JSON string
        with a TTL). ``process_id`` is ``host:pid:hex``, made by the host."""
        return f"{self.prefix}:process:{process_id}"

    def command(self, command_id: str) -> str:
        """``P:command:<id>``: one operator command's record (a stream: sent,
        then the worker's replies), with a TTL."""
        return f"{self.prefix}:command:{command_id}"

    def command_index(self) -> str:
        """``P:commands``: a zset of recent command ids -> when sent (ms),
        the newest ``protocol/control/commands.RECENT_KEPT`` kept."""
        return f"{self.prefix}:commands"

    def child_keys(self, queue: str, parent_id: str, entries: list) -> list[str]:
        """The child refs (full job keys) of entries (bytes or str) of the
        ``:children`` list of parent ``parent_id`` on ``queue``, in order,
        each in any form lua/lib/row.lua ever wrote (docs/explanation/protocol.md#a-parents-keys):
        ``:<rest>`` / ``<queue>::<rest>`` (the child's id is the parent's
        first ``REL_PREFIX`` bytes and the rest), ``:<a>:<b>`` /
        ``<queue>::<a>:<b>`` (a range: the rests hex ``a`` to ``b``, each
        child in turn), ``<id>`` / ``<queue>:<id>``, and the full key (the
        only form with a ``{``)."""
        mine, head, out = f"{self.prefix}:{{{queue}}}:{JOB_PREFIX}", None, []
        for entry in entries:
            entry = entry.decode() if isinstance(entry, bytes) else entry
            other, sep, rest = entry.partition(":")
            if "{" in entry or not sep:
                out.append(entry if sep else mine + entry)
                continue
            at = mine if not other else f"{self.prefix}:{{{other}}}:{JOB_PREFIX}"
            if other and rest[:1] != ":":
                out.append(at + rest)
                continue
            head = (id_head(parent_id) or "") if head is None else head
            low, _, high = rest.removeprefix(":").partition(":")  # relative; a range holds one more
            if high:
                out.extend(serial_ids(at + head, low, high))
            else:
                out.append(at + head + low)
        return out

    def parse_ref(self, ref: str) -> tuple[str, str]:
        """Split a child ref ``P:{q}:job:<id>`` into ``(queue, id)``.

        Raises ``ValueError`` when ``ref`` is not a job key under this prefix.
        """
        head = f"{self.prefix}:{{"
        queue, sep, rest = ref[len(head) :].partition("}:" + JOB_PREFIX)
        if not ref.startswith(head) or not sep:
            raise ValueError(f"not a job ref under prefix {self.prefix!r}: {ref!r}")
        return validate_queue(queue), validate_id(rest)

    def key_prefix(self, value: str) -> str | None:
        """The prefix of ``value`` when it is shaped as a job key
        ``P:{q}:job:<id>`` under any valid prefix, else None: so a key made
        by another ``EchoMQ`` is named, not taken for this one's."""
        m = _ANY_JOB_KEY.match(value)
        return m.group(1) if m else None

    def unkey(self, text: str | None) -> str | None:
        """``text`` (an error a script wrote: ``failed by child P:{q}:job:<id>:
        ...``) with each child key under this prefix written ``queue/id``, as
        the public API shows a job (docs/howto/read-flows.md#job-references). None stays
        None."""
        if not text or "failed by child " not in text:
            return text
        if self._failed_by is None:
            self._failed_by = re.compile(
                "(failed by child )" + re.escape(self.prefix) + _KEY_TAIL + "(?=: )"
            )
        return self._failed_by.sub(r"\1\2/\3", text)

    def parse_base_id(self, value: str) -> tuple[str, str]:
        """Split ``P:{q}:<id>`` (how scripts report jobs) into ``(queue, id)``."""
        head = f"{self.prefix}:{{"
        queue, sep, job_id = value[len(head) :].partition("}:")
        if not value.startswith(head) or not sep:
            raise ValueError(f"not a job under prefix {self.prefix!r}: {value!r}")
        return queue, job_id


def whole_number(
    name: str, value, low: int, optional: bool = False, high: int | None = None
) -> None:
    """Raise ``ValueError`` naming the rule unless ``value`` is an ``int`` >= ``low`` (and <=
    ``high`` when given; None allowed when ``optional``); bools and floats are refused, not
    rounded."""
    if value is None and optional:
        return
    bad = not isinstance(value, int) or isinstance(value, bool) or value < low
    if bad or (high is not None and value > high):
        unit = " (ms)" if name.endswith(("_ms", "-ms")) else ""
        rule = f">= {low}" if high is None else f"from {low} to {high:,}"
        raise ValueError(f"{name} must be a whole number {rule}{unit}, got {value!r}")
