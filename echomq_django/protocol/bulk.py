"""Bulk enqueue (docs/explanation/house.md, "protocol/"): many plain jobs of one queue
in few round trips (``lua/enqueue_many.lua``).

``Bulk`` is the part ``mq.bulk``; ``EchoMQ.enqueue_many`` hands its calls to
it, and the module API plans on the host first (``plan_many``) to check
every job before a transaction's commit lands them (``land_many``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core import flows as _flows
from ..core.jobs import to_json
from ..core.keyspace import validate_id, validate_queue, whole_number
from ..core.options import check_group, check_job_options
from ..core.retention import job_keep
from ..core.retry import CALLBACKS, RETRY_KEYWORDS, job_callbacks, job_retry, policy_keywords
from ..tracing.spans import adding
from .wire import Part, opt

# enqueue's options (docs/howto/retries.md: a retry policy, expiry, callbacks too)
POLICY = ("expires_ms", *RETRY_KEYWORDS, *CALLBACKS)
OPTIONS = (
    "job_id",
    "max_attempts",
    "backoff_ms",
    "delay_ms",
    "priority",
    "timeout_ms",
    "keep",
    "group",  # docs/explanation/protocol.md#groups
    *POLICY,
)


@dataclass(frozen=True)
class BulkPlan:
    """``plan_many``'s checked jobs of one queue: ``ids`` in order, and the
    rows ``land_many`` sends (run header, id, payload JSON per job)."""

    queue: str
    rows: list[tuple[tuple, str, str]]
    payloads: list = field(default_factory=list, compare=False)
    # per job: its retry policy, expiry and callbacks as enqueue's keywords (JSON-able)
    policies: list = field(default_factory=list, compare=False)

    @property
    def ids(self) -> list[str]:
        return [job_id for _, job_id, _ in self.rows]

    def jobs(self):
        """``(name, payload, job_id, enqueue options)`` per job, in order:
        what ``enqueue`` would be called with (api.enqueue_many's outbox rows)."""
        policies = self.policies or [{}] * len(self.rows)
        for (header, job_id, _), payload, policy in zip(
            self.rows, self.payloads, policies, strict=True
        ):
            name, attempts, backoff, delay, priority, timeout, keep, _gate, group = header[:9]
            options = {"delay_ms": int(delay), "priority": int(priority), **policy}
            for key, text in (("max_attempts", attempts), ("backoff_ms", backoff)):
                options[key] = int(text) if text else None
            options["timeout_ms"] = int(timeout) if timeout else None
            options["keep"] = int(keep) // 1000 if keep else None  # the row holds ms
            options["group"] = group or None
            yield name, payload, job_id, options


class Bulk(Part):
    """The bulk part of ``EchoMQ`` (``mq.bulk``)."""

    def enqueue_many(self, queue: str, jobs: Iterable) -> list[str]:
        """Add many plain jobs to ``queue``; returns their ids, in order.

        ``jobs``: each a ``(name, payload)`` pair, a ``(name, payload,
        options)`` triple, or a dict ``{"name": ..., "payload": ...,
        **options}``, where the options are ``enqueue``'s: ``job_id``
        (generated when absent), ``max_attempts``, ``backoff_ms`` (ms),
        ``delay_ms`` (ms), ``priority``, ``timeout_ms`` (ms), ``keep``
        (int >= 0, whole seconds a finished job is kept at most; 0: the
        next retention step takes it; None: the queue's ``KEEP_*`` alone,
        docs/explanation/lifecycle.md), ``expires_ms`` (default the
        queue's ``EXPIRES_MS``), ``backoff``, ``jitter``, ``retry_on``,
        ``dont_retry_on``, ``on_success`` / ``on_failure`` / ``on_dead``
        (docs/howto/retries.md, checked as ``enqueue`` checks them); not
        ``dedup_key`` (a deduplicated add answers another job's id) nor
        ``depends_on`` (a job that waits is a flow's node): use ``enqueue``
        for those.

        One round trip (a queue is one slot): up to ``flow_chunk`` jobs per
        script, pipelined. Every job is validated, and every given id gated,
        before anything is written: a bad job raises ``ValueError`` (or
        ``PayloadError``) naming its index, an id given twice in the call
        ``ValueError``, a taken id ``DuplicateJob``, and then nothing is
        written (a call of more than ``flow_chunk`` jobs is gated by a
        read-only pass first). Claimable jobs wake the queue's workers once
        per run of jobs sharing their options; delayed ones announce their run-at. Raises
        ``RedisUnavailable`` when Redis cannot be reached.
        """
        return self.land_many(self.plan_many(queue, jobs))

    def plan_many(self, queue: str, jobs: Iterable) -> BulkPlan:
        """Check and encode ``jobs`` for ``enqueue_many`` (the same errors,
        but a taken id) and fix their ids; writes nothing. What an
        ``on_commit`` add does before the commit (api.enqueue_many)."""
        validate_queue(queue)
        rows: list[tuple[tuple, str, str]] = []  # (run header, id, payload JSON) per job
        payloads: list = []
        policies: list = []
        given: set[str] = set()
        prefix = _flows.id_prefix()
        expires = opt((self.wire.queues.get(queue) or {}).get("EXPIRES_MS"))
        for index, job in enumerate(jobs):
            if type(job) is tuple and len(job) == 2 and isinstance(job[0], str) and job[0]:
                name, payload, options = job[0], job[1], None  # the common case, checked
            else:
                name, payload, options = _unpack(index, job)
            if not options:
                header = (name, "", "", "0", "0", "", "", "0", "", "", expires, "")
                job_id = f"{prefix}{index:x}"
                policies.append({})
            else:
                header, job_id, policy = _options(index, name, options, given, expires)
                job_id = job_id or f"{prefix}{index:x}"
                policies.append(policy)
            rows.append((header, job_id, self.wire.encode(payload, f"job {index}'s payload")))
            payloads.append(payload)
        return BulkPlan(queue, rows, payloads, policies)

    def land_many(self, plan: BulkPlan) -> list[str]:
        """Write a ``plan_many`` plan (see ``enqueue_many``); returns its ids."""
        queue, rows = plan.queue, plan.rows
        if not rows:
            return []
        # P:queues knows every queue with a job (docs/howto/operate.md)
        self.wire.note_queues((queue,))
        k = self.keys.queue(queue)
        keys, now = [k.pending, k.delayed, k.events], self.clock()
        chunks = [
            _flat(rows[i : i + self.wire.flow_chunk])
            for i in range(0, len(rows), self.wire.flow_chunk)
        ]

        # gate every chunk before the first writes (one chunk gates itself)
        with adding("enqueue_many", queue, plan.ids[0], len(rows)) as traceparent:
            for mode in ("check", "write") if len(chunks) > 1 else ("write",):
                args = [queue, k.base, now, mode]
                calls = [("enqueue_many", keys, [*args, c, traceparent]) for c in chunks]
                for reply in self.scripts.run_many(calls):
                    if isinstance(reply, Exception):
                        raise reply
        return plan.ids


def _flat(rows: list[tuple[tuple, str, str]]) -> str:
    """The script's argument: consecutive jobs sharing their options form a
    run (header, count, then id and payload per job)."""
    flat: list[str] = []
    for header, members in itertools.groupby(rows, key=lambda row: row[0]):
        members = list(members)
        flat += header
        flat.append(str(len(members)))
        for _, job_id, payload in members:
            flat.append(job_id)
            flat.append(payload)
    return to_json(flat)


def _options(
    index: int, name: str, options: dict, given: set[str], expires: str
) -> tuple[tuple, str | None, dict]:
    """A job's run header (name, max attempts, backoff, delay, priority,
    timeout, keep, gate, group, retry policy, expiry, callbacks), its given
    id (None: generate one) and its policy keywords (``policy_keywords``:
    what a deferred add keeps), checked; ``expires``: the queue's
    ``EXPIRES_MS`` as text ('' for none)."""
    job_id = options.get("job_id")
    if job_id is not None:
        validate_id(job_id)
        if job_id in given:
            raise ValueError(
                f"enqueue_many: job {index} repeats the id {job_id!r}; ids are unique per queue"
            )
        given.add(job_id)
    delay, priority, timeout = (options.get(k) for k in ("delay_ms", "priority", "timeout_ms"))
    try:
        whole_number("max_attempts", options.get("max_attempts"), 1, optional=True)
        whole_number("backoff_ms", options.get("backoff_ms"), 0, optional=True)
        whole_number("delay_ms", delay or 0, 0)
        check_job_options(priority or 0, delay or 0, timeout)
        keep = job_keep(options.get("keep"))  # ms text, '' for None (enqueue's rule and words)
        group = check_group(options.get("group"))  # docs/explanation/protocol.md#groups
        policy = policy_keywords({k: v for k, v in options.items() if k in POLICY})
        retry = job_retry(*(policy.get(k) for k in RETRY_KEYWORDS))
        callbacks = job_callbacks(**{k: policy.get(k) for k in CALLBACKS})
    except ValueError as err:
        raise ValueError(f"enqueue_many: job {index}: {err}") from None
    if policy.get("expires_ms") is not None:
        expires = str(policy["expires_ms"])
    header = (
        name,
        opt(options.get("max_attempts")),
        opt(options.get("backoff_ms")),
        str(int(delay or 0)),
        str(int(priority or 0)),
        opt(timeout),
        keep,
        "1" if job_id is not None else "0",
        group or "",
        retry,
        expires,
        callbacks,
    )
    return header, job_id, policy


def _unpack(index: int, job: Any) -> tuple[str, Any, dict]:
    """``(name, payload, options)`` of one job of ``enqueue_many``, checked."""
    if isinstance(job, dict):
        options = {k: v for k, v in job.items() if k not in ("name", "payload")}
        name, payload = job.get("name"), job.get("payload")
    elif isinstance(job, tuple | list) and len(job) in (2, 3):
        name, payload = job[0], job[1]
        if len(job) == 3 and not isinstance(job[2], dict):
            raise ValueError(
                f"enqueue_many: job {index}'s options (its third item) must be a dict, "
                f"got {type(job[2]).__name__}"
            )
        options = dict(job[2]) if len(job) == 3 else {}
    else:
        raise ValueError(
            f"enqueue_many: job {index} must be (name, payload), (name, payload, options) "
            f"or a dict with 'name' and 'payload'; got {type(job).__name__}"
        )
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"enqueue_many: job {index} has unknown options {unknown}; allowed: "
            f"{', '.join(OPTIONS)} (dedup_key, depends_on: use enqueue)"
        )
    if not isinstance(name, str) or not name:
        raise ValueError(f"enqueue_many: job {index} needs a name (the handler's), got {name!r}")
    return name, payload, options
