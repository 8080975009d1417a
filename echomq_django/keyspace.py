"""Every Redis key echomq_django uses, and the rules for the names inside them.

This is the only module that knows the prefix and builds key names (DESIGN §3,
STYLE rule 1). Every key of queue ``q`` is ``P:{q}:...``; the ``{q}`` hash tag
pins a queue to one Redis Cluster slot, so all of a queue's keys can be used
by one Lua script.
"""

from __future__ import annotations

import re

QUEUE_RULE = "a queue name is 1-64 characters from A-Z a-z 0-9 _ . -"
ID_RULE = "a job id is 1-128 characters with no '{', '}', ':' or whitespace"
PREFIX_RULE = "a prefix is 1-32 characters from A-Z a-z 0-9 _ . -"

_QUEUE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_ID_RE = re.compile(r"[^{}:\s]{1,128}\Z")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}\Z")


def validate_queue(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name (DESIGN §3).

    Raises ``ValueError`` naming the rule when it is not a ``str`` matching
    ``[A-Za-z0-9_.-]{1,64}``.
    """
    if not isinstance(queue, str) or not _QUEUE_RE.match(queue):
        raise ValueError(f"invalid queue name {queue!r}: {QUEUE_RULE}")
    return queue


def validate_id(job_id: object) -> str:
    """Return ``job_id`` if it is a valid job id (DESIGN §3).

    Raises ``ValueError`` naming the rule when it is not a ``str`` of 1-128
    characters without ``{``, ``}``, ``:`` or whitespace.
    """
    if not isinstance(job_id, str) or not _ID_RE.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}: {ID_RULE}")
    return job_id


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if valid; ``ValueError`` naming the rule otherwise."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid key prefix {prefix!r}: {PREFIX_RULE}")
    return prefix


class Keyspace:
    """Builds the keys of DESIGN §3 for one prefix (default ``emq``).

    Every method validates the queue name (and job id) before it builds a key,
    raising ``ValueError`` naming the rule.
    """

    def __init__(self, prefix: str = "emq") -> None:
        self.prefix = validate_prefix(prefix)

    def base(self, queue: str) -> str:
        """``P:{q}:``, the prefix of every key of ``queue``; Lua scripts get it
        as ARGV and build keys of the same slot from it."""
        return f"{self.prefix}:{{{validate_queue(queue)}}}:"

    def job(self, queue: str, job_id: str) -> str:
        """``P:{q}:job:<id>``: the job row (hash). It is also the child ref."""
        return f"{self.base(queue)}job:{validate_id(job_id)}"

    child_ref = job

    def refs(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Child refs of ``(queue, id)`` pairs whose names were validated
        already (flows.plan); each queue is checked once, not per id."""
        bases = {q: self.base(q) for q in {q for q, _ in pairs}}
        return [f"{bases[q]}job:{i}" for q, i in pairs]

    def job_part(self, queue: str, job_id: str, part: str) -> str:
        """``P:{q}:job:<id>:<part>`` for part in dependencies, children,
        processed, failed, unsuccessful, removed."""
        return f"{self.job(queue, job_id)}:{part}"

    def queue_key(self, queue: str, name: str) -> str:
        """``P:{q}:<name>`` for name in pending, active, delayed, awaiting,
        completed, dead, events, flow:outbox, flow:deadletter, pump:lock,
        lease:seq."""
        return f"{self.base(queue)}{name}"

    def queues(self) -> str:
        """``P:queues``: a set of every queue that has had a job (DESIGN §10.5).
        Not on any queue's slot: the host adds to it, never a script."""
        return f"{self.prefix}:queues"

    def processes(self) -> str:
        """``P:processes``: a zset of live worker and pump ids -> the ms time
        their registration expires (DESIGN §10.5)."""
        return f"{self.prefix}:processes"

    def process(self, process_id: str) -> str:
        """``P:process:<id>``: one worker's or pump's heartbeat (a JSON string
        with a TTL). ``process_id`` is ``host:pid:hex``, made by the host."""
        return f"{self.prefix}:process:{process_id}"

    def parse_ref(self, ref: str) -> tuple[str, str]:
        """Split a child ref ``P:{q}:job:<id>`` into ``(queue, id)``.

        Raises ``ValueError`` when ``ref`` is not a job key under this prefix.
        """
        head = f"{self.prefix}:{{"
        queue, sep, rest = ref[len(head) :].partition("}:job:")
        if not ref.startswith(head) or not sep:
            raise ValueError(f"not a job ref under prefix {self.prefix!r}: {ref!r}")
        return validate_queue(queue), validate_id(rest)

    def parse_base_id(self, value: str) -> tuple[str, str]:
        """Split ``P:{q}:<id>`` (how scripts report jobs) into ``(queue, id)``."""
        head = f"{self.prefix}:{{"
        queue, sep, job_id = value[len(head) :].partition("}:")
        if not value.startswith(head) or not sep:
            raise ValueError(f"not a job under prefix {self.prefix!r}: {value!r}")
        return queue, job_id


def whole_number(name: str, value, low: int, optional: bool = False) -> None:
    """Raise ``ValueError`` naming the rule unless ``value`` is an ``int`` >= ``low``
    (None allowed when ``optional``); bools and floats are refused, not rounded."""
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        unit = " (ms)" if name.endswith("_ms") else ""
        raise ValueError(f"{name} must be a whole number >= {low}{unit}, got {value!r}")
